#!/bin/bash
# One device call: build the standalone backward harness (parallel nvcc), run the checks
# and the benchmark, then the PyTorch SDPA backward comparison.
# Usage (repo root): bash kernels/gen1/tests/bwd_run_device.sh [all|check|bench] [arch]
set -o pipefail
MODE=${1:-all}
ARCH=${2:-sm_90a}
OUTDIR=${OUT:-/tmp/bwd_out}
mkdir -p "$OUTDIR" /tmp/bwdh
FLAGS="-std=c++17 -O3 -DNDEBUG -arch=$ARCH --use_fast_math -Iinclude -Isrc -Ikernels"
srcs="kernels/gen1/tests/bwd_harness.cu src/cuda/gen1_bwd.cu src/error.cpp $(ls kernels/gen1/bwd_*.cu)"
pids=()
for f in $srcs; do
  o=/tmp/bwdh/$(basename $f).o
  ( nvcc $FLAGS -Xptxas -v -c $f -o $o > /tmp/bwdh/$(basename $f).log 2>&1 || { echo "COMPILE FAILED $f"; cat /tmp/bwdh/$(basename $f).log; } ) &
  pids+=($!)
done
for p in "${pids[@]}"; do wait $p; done
cat /tmp/bwdh/*.log > "$OUTDIR/ptxas.txt"
nvcc -arch=$ARCH /tmp/bwdh/*.o -o /tmp/bwdh/bwd_harness || exit 1
grep -E "bwd_main|spill|registers" "$OUTDIR/ptxas.txt" | grep -B1 -A1 "bwd_main" | grep -E "spill|Used" | paste - - | sed 's/ptxas info *: //' | head -20
/tmp/bwdh/bwd_harness "$MODE" 2>&1 | tee "$OUTDIR/harness.txt"
rc=$?
if [ -n "$PROF" ]; then
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  $NCU --kernel-name regex:bwd_main --launch-count 1 --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
    --section InstructionStats /tmp/bwdh/bwd_harness prof > "$OUTDIR/ncu.txt" 2>&1
  grep -E "Duration|Throughput|Issued|Eligible|Active Warps|Stall|stall|Pipe|Achieved|Registers|Bank|Executed Ipc|No Eligible|One or More" "$OUTDIR/ncu.txt" | head -60
fi
if [ "$MODE" != check ] && [ -z "$NO_SDPA" ]; then
  PYTHONUNBUFFERED=1 python3 kernels/gen1/tests/bwd_sdpa_bench.py 2>&1 | tee "$OUTDIR/sdpa.txt"
fi
if [ -n "$CTEST" ]; then
  # The official GPU tests through the public API (library + tests/test_gpu.cpp).
  ( cmake -S . -B /tmp/build-bwd -DFLASHATTN_ENABLE_CUDA=ON -DFLASHATTN_CUDA_ARCHITECTURES=90a-real \
      -DFLASHATTN_BUILD_DOCS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF > "$OUTDIR/cmake.txt" 2>&1 &&
    cmake --build /tmp/build-bwd -j16 --target test_gpu >> "$OUTDIR/cmake.txt" 2>&1 &&
    cd /tmp/build-bwd && timeout ${CTEST_TIMEOUT:-200} ctest -L gpu --output-on-failure ${CTEST_ARGS} > "$OUTDIR/ctest.txt" 2>&1 )
  echo "ctest rc=$?"; tail -5 "$OUTDIR/cmake.txt"; grep -E "Passed|Failed|tests passed|FAILED|Not Run|Timeout" "$OUTDIR/ctest.txt" | tail -40
fi
echo "== SUMMARY =="; grep -hE "FAIL|CHECKS|BENCH" "$OUTDIR/harness.txt" "$OUTDIR/sdpa.txt" 2>/dev/null
exit $rc
