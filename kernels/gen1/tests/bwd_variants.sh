#!/bin/bash
# One device call for same-run A/B tuning of the gen1 backward: builds the standalone
# harness once per variant (parallel nvcc), runs the harness checks on the variants named in
# CHECK (overlapped with the other builds), times every variant, optionally profiles one
# with ncu, then times PyTorch SDPA (FA2, cuDNN) in the same call.
# Usage (repo root):
#   VARIANTS="base@/path/to/old/kernel/dir: cand:-DFA_BWD_X=1 ..." CHECK="cand" \
#     NCU="cand" [CTEST=1] bash kernels/gen1/tests/bwd_variants.sh
# A variant is NAME:FLAGS (FLAGS: -D overrides, commas for spaces) or NAME@DIR:FLAGS, where
# DIR holds gen1/bwd_kernel.cuh to build instead of the tree's (e.g. the committed one).
# CTEST_CUDA_FLAGS: extra nvcc flags of the library that CTEST=1 builds and tests (e.g. the -D
# knobs of a candidate, so that the tested library equals a tree with those defaults);
# CTEST_ARGS: extra ctest arguments (e.g. "-LE slow"); BWD_BENCH_MIN_SEQ=N (harness and
# SDPA): only the shapes with seqlen >= N. SAN="a b": compute-sanitizer on those variants
# (memcheck on the cases matching MEM_FILTER, default all; racecheck and synccheck on
# SAN_FILTER's), each tool run limited to SAN_TIMEOUT seconds.
set -o pipefail
ARCH=${ARCH:-sm_90a}
OUTDIR=${OUT:-/tmp/bwd_out}
mkdir -p "$OUTDIR"
BASEFLAGS="-std=c++17 -O3 -DNDEBUG -arch=$ARCH --use_fast_math"
srcs="kernels/gen1/tests/bwd_harness.cu src/cuda/gen1_bwd.cu src/cuda/tensor_map.cpp src/error.cpp $(ls kernels/gen1/bwd_*.cu)"
build() {  # name incdir flags
  local name=$1 inc=$2 flags=$3 d=/tmp/bwdv/$1
  mkdir -p $d
  local pids=()
  for f in $srcs; do
    ( nvcc $BASEFLAGS $flags ${inc:+-I$inc} -Iinclude -Isrc -Ikernels -Xptxas -v -c $f -o $d/$(basename $f).o \
        > $d/$(basename $f).log 2>&1 || { echo "COMPILE FAILED $name $f"; tail -20 $d/$(basename $f).log; } ) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p; done
  nvcc -arch=$ARCH $d/*.o -o $d/bwd_harness || { echo "LINK FAILED $name"; return 1; }
  cat $d/*.log > "$OUTDIR/ptxas_$name.txt"
  echo "built $name: $(grep -h -A1 'bwd_main' $d/bwd_*bf16*.log | grep -oE 'Used [0-9]+ registers|[0-9]+ bytes spill stores' | paste -sd' ' | cut -c1-200)"
}
names=()
declare -A FL INC
for v in $VARIANTS; do
  spec=${v%%:*}; flags=${v#*:}; flags=${flags//,/ }
  name=${spec%%@*}; inc=""; [[ "$spec" == *@* ]] && inc=${spec#*@}
  names+=($name); FL[$name]="$flags"; INC[$name]="$inc"
done
checkpids=()
# Checked variants first, their checks run while the others build.
for n in $CHECK; do
  build $n "${INC[$n]}" "${FL[$n]}" || exit 1
  ( /tmp/bwdv/$n/bwd_harness check > "$OUTDIR/check_$n.txt" 2>&1; echo "check $n rc=$?" >> "$OUTDIR/check_$n.txt" ) &
  checkpids+=($!)
done
for n in "${names[@]}"; do
  [[ " $CHECK " == *" $n "* ]] && continue
  build $n "${INC[$n]}" "${FL[$n]}" || exit 1
done
if [ -n "$CTEST" ]; then
  # Library + GPU tests build (CPU) while the checks and benchmarks run.
  ( cmake -S . -B /tmp/build-bwd -G Ninja -DFLASHATTN_ENABLE_CUDA=ON -DFLASHATTN_CUDA_ARCHITECTURES=90a-real \
      -DFLASHATTN_BUILD_DOCS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF ${CTEST_CUDA_FLAGS:+"-DCMAKE_CUDA_FLAGS=$CTEST_CUDA_FLAGS"} \
      > "$OUTDIR/cmake.txt" 2>&1 &&
    cmake --build /tmp/build-bwd -j12 >> "$OUTDIR/cmake.txt" 2>&1; echo "build rc=$?" >> "$OUTDIR/cmake.txt" ) &
  ctest_build=$!
fi
for p in "${checkpids[@]}"; do wait $p; done
for n in $CHECK; do echo "== check $n: $(grep -E 'CHECKS|rc=' $OUTDIR/check_$n.txt | paste -sd' ')"; grep FAIL $OUTDIR/check_$n.txt | head; done
for n in "${names[@]}"; do
  /tmp/bwdv/$n/bwd_harness bench 2>&1 | sed "s/^BENCH gen1-bwd/BENCH $n/" | tee -a "$OUTDIR/bench.txt"
done
for n in $NCU; do
  NCUB=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  # Stall reasons (warps per issued instruction), executed instructions, tensor pipe.
  M=smsp__inst_executed.sum,sm__cycles_elapsed.avg,smsp__issue_active.avg.pct_of_peak_sustained_active
  M=$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__throughput.avg.pct_of_peak_sustained_active
  for r in barrier short_scoreboard long_scoreboard mio_throttle math_pipe_throttle wait not_selected selected \
      lg_throttle dispatch_stall no_instruction branch_resolving membar imc_miss misc drain sleeping tex_throttle; do
    M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
  done
  timeout 150 $NCUB --kernel-name regex:bwd_main --launch-count 1 --metrics $M /tmp/bwdv/$n/bwd_harness prof \
    > "$OUTDIR/ncu_$n.txt" 2>&1
  echo "== ncu $n"; grep -E "^ +(smsp|sm__|l1tex)" "$OUTDIR/ncu_$n.txt" | awk '{print $1, $NF}' | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//'
done
if [ -z "$NO_SDPA" ]; then
  PYTHONUNBUFFERED=1 python3 kernels/gen1/tests/bwd_sdpa_bench.py 2>&1 | tee "$OUTDIR/sdpa.txt"
fi
if [ -n "$CTEST" ]; then
  wait $ctest_build
  tail -2 "$OUTDIR/cmake.txt"
  # The GPU tests run beside the sanitizer runs (correctness only, no timing).
  ( cd /tmp/build-bwd && timeout ${CTEST_TIMEOUT:-200} ctest -L gpu $CTEST_ARGS --output-on-failure > "$OUTDIR/ctest.txt" 2>&1;
    echo "ctest rc=$?" >> "$OUTDIR/ctest.txt" ) &
  ctest_pid=$!
fi
if [ -n "$SAN" ]; then
  # compute-sanitizer on the harness checks of each variant in $SAN: memcheck on every case,
  # racecheck (shared-memory hazards) and synccheck (barrier use) on a few.
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for sv in $SAN; do
    BWD_CHECK_FILTER="${MEM_FILTER:-}" timeout ${SAN_TIMEOUT:-150} $CS --tool memcheck --error-exitcode 9 /tmp/bwdv/$sv/bwd_harness check > "$OUTDIR/memcheck_$sv.txt" 2>&1
    echo "memcheck $sv rc=$? $(grep -E 'CHECKS|ERROR SUMMARY' $OUTDIR/memcheck_$sv.txt | paste -sd' ')"
    for tool in racecheck synccheck; do
      BWD_CHECK_FILTER="${SAN_FILTER:-bf16 d=64 |bf16 d=128 |causal d256|deterministic MQA}" timeout ${SAN_TIMEOUT:-150} \
        $CS --tool $tool --error-exitcode 9 /tmp/bwdv/$sv/bwd_harness check > "$OUTDIR/${tool}_$sv.txt" 2>&1
      echo "$tool $sv rc=$? $(grep -E 'CHECKS|RACECHECK SUMMARY|ERROR SUMMARY' $OUTDIR/${tool}_$sv.txt | paste -sd' ')"
    done
  done
fi
if [ -n "$CTEST" ]; then
  wait $ctest_pid
  grep -E "ctest rc|tests passed|Failed|FAILED|Timeout|Passed" "$OUTDIR/ctest.txt" | tail -30
fi
echo "== SUMMARY =="
python3 - "$OUTDIR/bench.txt" "$OUTDIR/sdpa.txt" <<'EOF'
import re, sys
rows, cols = {}, []
for path in sys.argv[1:]:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for l in lines:
        m = re.match(r"BENCH (\S+) d=(\d+) seq=(\d+) ?(\w*).*?([\d.]+) TFLOP/s", l)
        if not m:
            continue
        name, d, s, c, tf = m.groups()
        name = name.replace("sdpa-", "").replace("-bwd", "")
        det = "-det" in name
        name = name.replace("-det", "")
        key = f"d={d} s={s}{' causal' if c == 'causal' else ''}{' det' if det else ''}"
        rows.setdefault(key, {})[name] = float(tf)
        if name not in cols:
            cols.append(name)
print("shape".ljust(26) + "".join(c[:10].rjust(11) for c in cols))
for k, r in rows.items():
    print(k.ljust(26) + "".join((f"{r[c]:.1f}" if c in r else "-").rjust(11) for c in cols))
EOF
