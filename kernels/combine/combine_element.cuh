// The arithmetic of one merged element over the split parts, as the combine kernel's loops
// (combine_kernel.cuh) have it, for the decode kernel's merge of a cluster's splits in
// distributed shared memory (decode_kernel.cuh, cluster_merge), which must give the
// combine's bits: over parts with a finite LSE, lse = lse_max + log(sum exp(lse_i -
// lse_max)), O = sum exp(lse_i - lse) O_i, in increasing split order; no part gives O = 0,
// LSE = -inf; a NaN part gives NaN. lse_of(s) and o_of(s) read part s; the loops are
// unrolled by 16 as the combine's. The combine kernel keeps its own loops: compiled through
// this function it took 40 registers instead of 48 and 2-3 us more at 32 splits
// (docs/internals/kernels-decode.md); tests/test_gpu_inference.cpp checks the two agree
// bit for bit.
#pragma once
#include <math.h>
#include <stdint.h>

namespace flashattn {
namespace combine {

template <typename Lse, typename O>
__device__ __forceinline__ void combine_element(int64_t splits, const Lse& lse_of, const O& o_of, float* out,
                                                float* lse_out) {
  float lse_max = -INFINITY;
  bool nan = false;
#pragma unroll 16
  for (int64_t s = 0; s < splits; ++s) {
    const float l = lse_of(s);
    nan |= l != l;
    if (l > lse_max) lse_max = l;
  }
  *out = 0.f;
  *lse_out = -INFINITY;
  if (nan) {
    *out = *lse_out = NAN;
  } else if (lse_max != -INFINITY) {
    float sum = 0.f;
#pragma unroll 16
    for (int64_t s = 0; s < splits; ++s) {
      const float l = lse_of(s);
      if (l != -INFINITY) sum += expf(l - lse_max);
    }
    const float lse = lse_max + logf(sum);
    float o = 0.f;
#pragma unroll 16
    for (int64_t s = 0; s < splits; ++s) {
      const float l = lse_of(s);
      if (l != -INFINITY) o += expf(l - lse) * o_of(s);
    }
    *out = o;
    *lse_out = lse;
  }
}

}  // namespace combine
}  // namespace flashattn
