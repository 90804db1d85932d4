#!/bin/bash
# One device call: build the standalone forward harness (16 jobs), run checks + benchmark,
# then the PyTorch SDPA comparison. Usage (repo root): bash kernels/gen1/tests/run_device.sh [arch]
set -o pipefail
ARCH=${1:-sm_90}
OUTDIR=${OUT:-/tmp/fwd_out}
mkdir -p "$OUTDIR" /tmp/fwdh
FLAGS="-std=c++17 -O3 -DNDEBUG -arch=$ARCH --use_fast_math -Iinclude -Isrc -Ikernels"
srcs="kernels/gen1/tests/fwd_harness.cu src/cuda/gen1_fwd.cu src/cuda/gen1_check.cpp src/error.cpp $(ls kernels/gen1/fwd_*.cu)"
pids=()
for f in $srcs; do
  o=/tmp/fwdh/$(basename $f).o
  ( nvcc $FLAGS -Xptxas -v -c $f -o $o > /tmp/fwdh/$(basename $f).log 2>&1 || { echo "COMPILE FAILED $f"; cat /tmp/fwdh/$(basename $f).log; } ) &
  pids+=($!)
done
for p in "${pids[@]}"; do wait $p; done
cat /tmp/fwdh/*.log > "$OUTDIR/ptxas.txt"
nvcc -arch=$ARCH /tmp/fwdh/*.o -o /tmp/fwdh/fwd_harness || exit 1
grep -E "spill|registers" "$OUTDIR/ptxas.txt" | paste - - | sed 's/ptxas info *: //' | head -40
/tmp/fwdh/fwd_harness ${2:-all} 2>&1 | tee "$OUTDIR/harness.txt"
rc=$?
[ -n "$NO_SDPA" ] || PYTHONUNBUFFERED=1 python3 kernels/gen1/tests/sdpa_bench.py 2>&1 | tee "$OUTDIR/sdpa.txt"
echo "== SUMMARY =="; grep -E "FAIL|CHECKS|BENCH" "$OUTDIR/harness.txt" "$OUTDIR/sdpa.txt" 2>/dev/null | sed 's/^[^:]*://'
exit $rc
