#!/usr/bin/env bash
# The check of the FA3-design backward (kernels/fa3/bwd_*) on an H100/H200, in one device
# call: builds through scripts/gpu_check.sh (its configure + build steps only, ~1-2 min), then
#   1. ptxas: registers and spills (-Xptxas -v) of every fa3 backward instance, compiled
#      alone for sm_90a with the library's flags; fails on spills or on the wgmma
#      serialization warnings (any C75xx);
#   2. SASS of each: counts of HGMMA, UTMALDG, USETMAXREG, UTMAREDG (the dQ reduce-adds; each
#      must be > 0) and local-memory accesses LDL/STL (must be 0);
#   3. tests: test_gpu_backward_paths on fa3 first (a hung pipeline stops at the per-test
#      timeout, and then the bench is skipped), then on fa2, then the refused value of the
#      variable (ctest -R '^bwd-'; TEST_PATHS picks among fa3, fa2, bad), then (STEPS has
#      suite) the non-slow GPU suite; the deterministic cases run on both families (five
#      runs each, bitwise equal), and on fa3 one is compared bit for bit with the automatic
#      path's run;
#   4. bench/bench.py (forward and backward; the backward is the point), bf16, d 64, 96, 128,
#      192, 256, causal and not, seqlen 1k/4k/16k: lib-flash, lib-flash-det (deterministic
#      mode: the table's det column is its ratio to lib-flash) and SDPA cuDNN with
#      FLASHATTN_CUDA_BACKWARD=fa3, then lib-flash alone with fa2.
# usage: scripts/gpu_fa3_bwd_check.sh
# environment: BUILD_DIR (default <repo>/build-gpu), JOBS (default 16), OUT (receives
#   fa3-bwd-check.log, bench-bwd-fa2/ and bench-bwd-fa3/), STEPS (default
#   ptxas,sass,tests,suite,bench), TEST_PATHS (default "fa3 fa2 bad"), TEST_EXCLUDE (a ctest
#   -E regex: backward-path tests to leave out), BENCH_ARGS (extra
#   arguments for bench/bench.py, after the defaults: a later --hdims replaces them),
#   TEST_TIMEOUT (seconds per test, default 120), BENCH_TIMEOUT (seconds per bench run,
#   default 240).
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CHECK=fa3-bwd-check
STEPS=${STEPS:-ptxas,sass,tests,suite,bench}
# shellcheck source=scripts/fa3_check_common.sh
source "$ROOT/scripts/fa3_check_common.sh"
UNITS=("$ROOT"/kernels/fa3/instances/bwd_*_sm90a.cu)

if want ptxas || want sass; then
  echo "==== ptxas -v of the fa3 backward instances (sm_90a)"
  fa3_ptxas "${UNITS[@]}"
fi

if want sass; then
  echo "==== SASS of the fa3 backward kernels"
  fa3_sass_check "${UNITS[@]}" -- HGMMA UTMALDG USETMAXREG UTMAREDG
fi

if want tests; then
  for path in ${TEST_PATHS:-fa3 fa2 bad}; do
    echo "==== test_gpu_backward_paths: bwd-$path"
    ctest --test-dir "$BUILD" -R "^bwd-$path:" ${TEST_EXCLUDE:+-E "$TEST_EXCLUDE"} --output-on-failure \
      --timeout "$TEST_TIMEOUT" > "$WORK/bwd-$path.log" 2>&1 ||
      fail "backward-path tests ($path)"
    cat "$WORK/bwd-$path.log"
    # A hung fa3 pipeline would hang every later fa3 run too: the benchmark is skipped.
    if [[ $path == fa3 ]] && grep -q '\*\*\*Timeout' "$WORK/bwd-$path.log"; then
      fail "an fa3 test timed out: skipping the bench"
      STEPS=${STEPS//bench/}
    fi
  done
fi
if want suite; then
  echo "==== the GPU suite, automatic backward path"
  ctest --test-dir "$BUILD" -L '^gpu$' -E '^(bwd-)?(fa[23]|bad):' --output-on-failure --timeout "$TEST_TIMEOUT" ||
    fail "GPU suite"
fi

# One bench run: $1 = the forced backward path, $2 = the implementations.
bench() {
  echo "==== bench, FLASHATTN_CUDA_BACKWARD=$1, $2"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of words
  FLASHATTN_CUDA_BACKWARD=$1 timeout "$BENCH_TIMEOUT" python3 "$ROOT/bench/bench.py" --lib "$LIB" \
    --out "$RESULTS/bench-bwd-$1" --record '' --no-memory --no-sparse --dtypes bf16 --hdims 64,96,128,192,256 \
    --seqlens 1024,4096,16384 --impls "$2" ${BENCH_ARGS:-} || fail "bench ($1)"
}
if want bench; then
  bench fa3 lib-flash,lib-flash-det,cudnn
  bench fa2 lib-flash
fi

[[ $FAILED == 0 ]] && echo "gpu_fa3_bwd_check: OK" || echo "gpu_fa3_bwd_check: FAILED (see above)"
exit $FAILED
