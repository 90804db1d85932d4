#!/bin/sh
# The accumulating backward (flashattn_plan_set_grad_accumulate) and ring attention's
# memory per GPU (issue 22) on one GPU host, in one run from a checkout:
#   sh bindings/python/benchmarks/accumulate_gpu_check.sh
# 1. configures and builds libflashattn with CUDA and test_gpu in BUILD_DIR (default
#    <repo>/build-gpu; FLASHATTN_CUDA_ARCHITECTURES default 90a-real, JOBS default 16);
# 2. test_gpu "[accumulate]": every option on fa2 and STANDARD against the fp64 reference
#    with nonzero starting gradients, several tiles, deterministic runs bit for bit; then
#    test_gpu "[bwd]" (every backward case: they all run through the changed epilogue);
# 3. ring_check.sh on GPUS (default 2) GPUs: the ring cases over NCCL, then the 128k-token
#    benchmark (forward+backward speedup against one GPU, target >= 1.8x; peak memory per
#    GPU, target about 0.5 of one GPU's; the docs' count predicts 0.54) and one GPU's
#    backward over a shard with and without accumulation.
# Needs CUDA, cmake, ninja, and for step 3 torch with CUDA and NCCL (FLASHATTN_PYTHON,
# default python3). Exit status 0 when every step passed.
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
status=0
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_ENABLE_CUDA=ON \
  -DFLASHATTN_CUDA_ARCHITECTURES="${FLASHATTN_CUDA_ARCHITECTURES:-90a-real}" -DFLASHATTN_BUILD_TESTS=ON || exit 1
cmake --build "$build" -j "${JOBS:-16}" --target flashattn test_gpu || exit 1
"$build/tests/test_gpu" "[accumulate]" || status=1
"$build/tests/test_gpu" "[bwd]" || status=1
sh "$root/bindings/python/benchmarks/ring_check.sh" "$build/libflashattn.so.0" || status=1
exit $status
