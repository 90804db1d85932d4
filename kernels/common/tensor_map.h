// The TMA tensor map (the descriptor of the Hopper copy engine) as kernels receive it: an
// opaque block encoded on the host (src/cuda/tensor_map.hpp) and passed by value.
#pragma once

namespace flashattn {

// The opaque 128-byte descriptor (CUtensorMap), 64-byte aligned as the hardware requires.
struct alignas(64) TensorMap128 {
  unsigned char bytes[128];
};

}  // namespace flashattn
