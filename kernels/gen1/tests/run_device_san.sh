#!/bin/bash
# Device call: forward harness checks + benchmarks (+ SDPA), then compute-sanitizer memcheck
# over all check cases and racecheck over a few.
set -o pipefail
OUTDIR=${OUT:-/tmp/fwd_out}
bash kernels/gen1/tests/run_device.sh sm_90 checkopts > "$OUTDIR/harness_all.txt" 2>&1
echo "harness rc=$?"
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 /tmp/fwdh/fwd_harness check > "$OUTDIR/memcheck.txt" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|CHECKS|Invalid" "$OUTDIR/memcheck.txt" | head -5
FWD_FILTER=d=128 timeout 100 compute-sanitizer --tool racecheck --print-limit 5 /tmp/fwdh/fwd_harness check > "$OUTDIR/racecheck.txt" 2>&1
echo "racecheck rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|CHECKS|hazard" "$OUTDIR/racecheck.txt" | head -5
echo "== HARNESS SUMMARY =="; sed -n '/== SUMMARY ==/,$p' "$OUTDIR/harness_all.txt"
grep -E "FAIL" "$OUTDIR/harness_all.txt" | head
