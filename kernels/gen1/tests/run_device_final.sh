#!/bin/bash
# Final device call: forward harness (checks, benchmarks, options, SDPA), memcheck of the
# block-sparse cases, full CMake build (sm_90) and the GPU-labelled CTest suite.
set -o pipefail
OUTDIR=${OUT:-/tmp/fwd_out}
bash kernels/gen1/tests/run_device.sh sm_90 checkopts > "$OUTDIR/harness_all.txt" 2>&1
echo "harness rc=$?"
FWD_FILTER=block-sparse timeout 90 compute-sanitizer --tool memcheck --print-limit 5 /tmp/fwdh/fwd_harness check > "$OUTDIR/memcheck.txt" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|CHECKS" "$OUTDIR/memcheck.txt" | head -3
t0=$(date +%s)
cmake -S . -B /tmp/build-gpu -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_ENABLE_CUDA=ON -DFLASHATTN_CUDA_ARCHITECTURES=90 \
  -DFLASHATTN_BUILD_DOCS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF > "$OUTDIR/cmake.txt" 2>&1 || { echo "configure failed"; tail -20 "$OUTDIR/cmake.txt"; }
cmake --build /tmp/build-gpu -j16 > "$OUTDIR/build.txt" 2>&1; echo "build rc=$? in $(( $(date +%s) - t0 )) s"
grep -E " error" "$OUTDIR/build.txt" | head -10
(cd /tmp/build-gpu && timeout 150 ctest -L gpu --output-on-failure -j4 > "$OUTDIR/ctest_gpu.txt" 2>&1; echo "ctest rc=$?")
grep -E "Test +#|tests passed" "$OUTDIR/ctest_gpu.txt" | head -30
echo "== HARNESS SUMMARY =="; sed -n '/== SUMMARY ==/,$p' "$OUTDIR/harness_all.txt"
grep -E "FAIL" "$OUTDIR/harness_all.txt" | head
