// The Sm90a decode kernels (copy-engine tiles): compiled only for the targets of the Sm90a
// policy (CMakeLists.txt, kernels/instances.json); src/cuda/decode.cu launches them on
// compute capability 9.0.
#include "decode/launch.cuh"

namespace flashattn {
namespace decode {
template cudaError_t reserve<fa2::Sm90a>(const AttnParams& p, const Launch<fa2::Sm90a>& l);
template cudaError_t resident_clusters<fa2::Sm90a>(const AttnParams& p, const Launch<fa2::Sm90a>& l, int* n);
template cudaError_t enqueue<fa2::Sm90a>(const AttnParams& p, const Launch<fa2::Sm90a>& l, cudaStream_t st);
}  // namespace decode
}  // namespace flashattn
