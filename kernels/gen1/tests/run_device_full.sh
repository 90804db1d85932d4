#!/bin/bash
# Device call: the standalone forward harness (checks, benchmarks, SDPA comparison), then a
# full CMake build for sm_90 and the GPU-labelled CTest suite. Usage: bash <this> [harness-mode]
set -o pipefail
OUTDIR=${OUT:-/tmp/fwd_out}
bash kernels/gen1/tests/run_device.sh sm_90 ${1:-options} > "$OUTDIR/harness_all.txt" 2>&1
echo "harness rc=$?"
t0=$(date +%s)
cmake -S . -B /tmp/build-gpu -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_ENABLE_CUDA=ON -DFLASHATTN_CUDA_ARCHITECTURES=90 \
  -DFLASHATTN_BUILD_DOCS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF > "$OUTDIR/cmake.txt" 2>&1 || { echo "configure failed"; tail -30 "$OUTDIR/cmake.txt"; }
cmake --build /tmp/build-gpu -j16 > "$OUTDIR/build.txt" 2>&1; echo "build rc=$? in $(( $(date +%s) - t0 )) s"
grep -E "error" "$OUTDIR/build.txt" | head -20
(cd /tmp/build-gpu && timeout 200 ctest -L gpu --output-on-failure -j4 > "$OUTDIR/ctest_gpu.txt" 2>&1; echo "ctest rc=$?")
grep -E "tests passed|FAILED|Failed|\*\*\*" "$OUTDIR/ctest_gpu.txt" | head -40
echo "== HARNESS SUMMARY =="; sed -n '/== SUMMARY ==/,$p' "$OUTDIR/harness_all.txt"
grep -E "FAIL " "$OUTDIR/harness_all.txt" | head
