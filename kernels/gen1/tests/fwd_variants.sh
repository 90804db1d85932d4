#!/bin/bash
# One device call for a same-run A/B of the gen1 forward: builds the standalone forward harness
# once per variant (parallel nvcc), runs its checks on the variants in CHECK (all cases, or
# "checkopts" with CHECK_MODE), times every variant ("bench"), then PyTorch SDPA.
# Usage (repo root): VARIANTS="off:-DFA_FWD_WG=0 wg:" CHECK="wg" bash kernels/gen1/tests/fwd_variants.sh
# A variant is NAME:FLAGS (FLAGS: -D overrides, commas for spaces).
set -o pipefail
ARCH=${ARCH:-sm_90a}
OUTDIR=${OUT:-/tmp/fwd_out}
mkdir -p "$OUTDIR"
srcs="kernels/gen1/tests/fwd_harness.cu src/cuda/gen1_fwd.cu src/cuda/gen1_check.cpp src/error.cpp $(ls kernels/gen1/fwd_*.cu)"
build() {  # name flags
  local d=/tmp/fwdv/$1 pids=()
  mkdir -p $d
  for f in $srcs; do
    ( nvcc -std=c++17 -O3 -DNDEBUG -arch=$ARCH --use_fast_math $2 -Iinclude -Isrc -Ikernels -Xptxas -v -c $f \
        -o $d/$(basename $f).o > $d/$(basename $f).log 2>&1 || { echo "COMPILE FAILED $1 $f"; tail -20 $d/$(basename $f).log; } ) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p; done
  nvcc -arch=$ARCH $d/*.o -o $d/fwd_harness || { echo "LINK FAILED $1"; return 1; }
  cat $d/*.log > "$OUTDIR/ptxas_$1.txt"
}
names=()
for v in $VARIANTS; do
  name=${v%%:*}; flags=${v#*:}; flags=${flags//,/ }
  names+=($name)
  build $name "$flags" &
done
wait
for n in $CHECK; do
  /tmp/fwdv/$n/fwd_harness ${CHECK_MODE:-check} > "$OUTDIR/check_$n.txt" 2>&1
  echo "== check $n rc=$?: $(grep -E 'CHECKS' $OUTDIR/check_$n.txt | paste -sd' ')"; grep FAIL "$OUTDIR/check_$n.txt" | head
done
for n in $SAN; do
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck; do
    timeout ${SAN_TIMEOUT:-120} $CS --tool $tool --error-exitcode 9 /tmp/fwdv/$n/fwd_harness check > "$OUTDIR/${tool}_$n.txt" 2>&1
    echo "$tool $n rc=$? $(grep -E 'CHECKS|SUMMARY' $OUTDIR/${tool}_$n.txt | paste -sd' ')"
  done
done
for n in "${names[@]}"; do
  /tmp/fwdv/$n/fwd_harness bench 2>&1 | sed "s/^BENCH /BENCH $n /" | tee -a "$OUTDIR/bench.txt" | grep BENCH
done
[ -n "$NO_SDPA" ] || PYTHONUNBUFFERED=1 python3 kernels/gen1/tests/sdpa_bench.py 2>&1 | tee "$OUTDIR/sdpa.txt" | grep -iE "bench|flash|cudnn" | head -40
