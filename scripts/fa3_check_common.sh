# Sourced by scripts/gpu_fa3_check.sh and scripts/gpu_fa3_bwd_check.sh after they set ROOT,
# CHECK (their name: the log and work folders) and STEPS (their default steps): the common
# setup (BUILD, JOBS, TEST_TIMEOUT, BENCH_TIMEOUT, RESULTS = $OUT, WORK; the log
# $RESULTS/$CHECK.log; want, fail, FAILED), the library build through scripts/gpu_check.sh
# (LIB; stops without it), the tools (NVCC, CUOBJDUMP) and the ptxas and SASS checks.
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
JOBS=${JOBS:-16}
TEST_TIMEOUT=${TEST_TIMEOUT:-120}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-240}
RESULTS=${OUT:-$BUILD/$CHECK}
WORK=$BUILD/$CHECK-work
mkdir -p "$RESULTS" "$WORK"
exec > >(tee "$RESULTS/$CHECK.log") 2>&1
want() { [[ ",$STEPS," == *",$1,"* ]]; }
FAILED=0
fail() { echo "FAIL: $*"; FAILED=1; }

echo "==== build (scripts/gpu_check.sh, configure + build only)"
BUILD_DIR=$BUILD JOBS=$JOBS FLASHATTN_CUDA_ARCHITECTURES=90a-real STEPS=none OUT='' "$ROOT/scripts/gpu_check.sh" quick ||
  fail "gpu_check.sh build"
LIB=$BUILD/libflashattn.so.0
[[ -f "$LIB" ]] || { echo "no $LIB: stopping"; exit 1; }

NVCC=${CUDACXX:-$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")}
CUOBJDUMP=$(command -v cuobjdump || echo "$(dirname "$NVCC")/cuobjdump")

#
# fa3_ptxas UNIT...: compiles each translation unit alone for sm_90a with the library's flags
# and -Xptxas -v (in parallel) into $WORK/<name>.cubin and $WORK/<name>.ptxas, prints its
# registers and spills, and calls fail on a compile error, on spills or on any of ptxas's
# C75xx warnings (setmaxnreg ignored, C7508; wgmma serialized, C7515/C7517/C7520 among them).
fa3_ptxas() {
  local u n p regs spill pids=()
  for u in "$@"; do
    n=$(basename "$u" .cu)
    "$NVCC" -std=c++17 -O3 -DNDEBUG --use_fast_math -gencode arch=compute_90a,code=sm_90a -cubin -Xptxas -v \
      -I"$ROOT/kernels" -I"$ROOT/include" -o "$WORK/$n.cubin" "$u" > "$WORK/$n.ptxas" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || fail "nvcc of an fa3 instance (see $WORK/*.ptxas)"; done
  for u in "$@"; do
    n=$(basename "$u" .cu)
    regs=$(grep -Eo 'Used [0-9]+ registers' "$WORK/$n.ptxas" | head -1)
    spill=$(grep -Eo '[0-9]+ bytes spill stores, [0-9]+ bytes spill loads' "$WORK/$n.ptxas" | head -1)
    printf '%-22s %s, %s\n' "$n" "$regs" "$spill"
    grep -q ' 0 bytes spill stores, 0 bytes spill loads' "$WORK/$n.ptxas" || fail "$n spills"
    if grep -E 'C75[0-9][0-9]' "$WORK/$n.ptxas"; then fail "$n: ptxas C75xx warning"; fi
  done
}

# fa3_sass_check UNIT... -- OP...: dumps the SASS of each unit's cubin (fa3_ptxas) into
# $WORK/<name>.sass and prints, a row per unit, how many instructions match each OP and the
# local-memory accesses (LDL, STL); calls fail when an OP is missing or local memory is used.
# Ends with the HGMMA shapes and register settings of all the units.
fa3_sass_check() {
  local units=() ops=() u n op c row msg bad sass=()
  while [[ $# -gt 0 && $1 != -- ]]; do units+=("$1"); shift; done
  shift
  ops=("$@")
  printf '%-22s' unit; printf ' %11s' "${ops[@]}" LDL STL; echo
  for u in "${units[@]}"; do
    n=$(basename "$u" .cu)
    "$CUOBJDUMP" --dump-sass "$WORK/$n.cubin" > "$WORK/$n.sass" || { fail "cuobjdump $n"; continue; }
    sass+=("$WORK/$n.sass")
    row=$(printf '%-22s' "$n") bad=()
    for op in "${ops[@]}" LDL STL; do
      c=$(grep -c "$op" "$WORK/$n.sass")
      row+=$(printf ' %11s' "$c")
      case $op in
        LDL | STL) [[ $c -eq 0 ]] || bad+=("$n uses local memory ($op)") ;;
        *) [[ $c -gt 0 ]] || bad+=("$n lacks $op") ;;
      esac
    done
    echo "$row"
    for msg in "${bad[@]}"; do fail "$msg"; done
  done
  [[ ${#sass[@]} -gt 0 ]] && grep -ho 'HGMMA\.[0-9x]*\S*\|USETMAXREG\.\S* [^;]*' "${sass[@]}" | sort | uniq -c
}
