#!/usr/bin/env bash
# The check of the FA3-design forward (kernels/fa3) on an H100/H200, in one device call of
# about 6-8 minutes with 16 cores: builds through scripts/gpu_check.sh (its configure + build
# steps only, ~1-2 min), then
#   1. ptxas: registers and spills (-Xptxas -v) of every fa3 instance, compiled alone for
#      sm_90a with the library's flags; fails on spills or on the wgmma serialization
#      warnings (any C75xx: setmaxnreg ignored, wgmma serialized);
#   2. SASS of each fa3 kernel: counts of HGMMA, UTMALDG, UTMASTG, USETMAXREG (each must be
#      > 0), local-memory accesses LDL/STL (must be 0), and MUFU.EX2 between the two wgmma
#      waits of the main loop (must be > 0: the softmax overlaps O += P V);
#   3. tests: test_gpu_forward_paths on fa3 first (a hung kernel stops at the per-test
#      timeout), then on fa2 (ctest -R '^fa[23]:'), then (STEPS has suite) the whole non-slow
#      GPU suite with the automatic choice, which sends the forward of every served case to
#      fa3;
#   4. bench/bench.py forward only, bf16 and fp16, d 64/128/256, causal and not, seqlen
#      1k..16k: lib-flash beside SDPA cuDNN with FLASHATTN_CUDA_FORWARD=fa3, then lib-flash
#      alone with fa2 (~3 min together);
#   5. record: bench/record_h100.py measures the cuBLAS bf16 8192^3 rate and appends one row
#      per configuration to bench/results/h100.csv (copied to OUT as well).
# usage: scripts/gpu_fa3_check.sh
# environment: BUILD_DIR (default <repo>/build-gpu), JOBS (default 16), OUT (receives
#   fa3-check.log, bench-fa2/, bench-fa3/ and h100.csv), STEPS (default
#   ptxas,sass,tests,suite,bench,record), BENCH_ARGS (extra arguments for bench/bench.py),
#   TEST_TIMEOUT (seconds per test, default 120), BENCH_TIMEOUT (seconds per bench run,
#   default 240).
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CHECK=fa3-check
STEPS=${STEPS:-ptxas,sass,tests,suite,bench,record}
# shellcheck source=scripts/fa3_check_common.sh
source "$ROOT/scripts/fa3_check_common.sh"
UNITS=("$ROOT"/kernels/fa3/instances/fwd_*_sm90a.cu)

if want ptxas || want sass; then
  echo "==== ptxas -v of the fa3 forward instances (sm_90a)"
  fa3_ptxas "${UNITS[@]}"
fi

if want sass; then
  echo "==== SASS of the fa3 kernels"
  fa3_sass_check "${UNITS[@]}" -- HGMMA UTMALDG UTMASTG USETMAXREG
  for u in "${UNITS[@]}"; do
    n=$(basename "$u" .cu)
    # The intra-warpgroup overlap: the softmax's exponentials between the wait for S
    # (DEPBAR.LE gsb0, 0x1) and the wait for O += P V (0x0).
    ex2=$(awk '/DEPBAR.LE gsb0, 0x1/ { s = 1 } s && /MUFU.EX2/ { c++ } /DEPBAR.LE gsb0, 0x0/ { s = 0 }
               END { print c + 0 }' "$WORK/$n.sass")
    [[ $ex2 -gt 0 ]] || fail "$n: no MUFU.EX2 between the two wgmma waits (the softmax no longer overlaps O += P V)"
  done
fi

if want tests; then
  for path in fa3 fa2; do
    echo "==== test_gpu_forward_paths on $path"
    ctest --test-dir "$BUILD" -R "^$path:" --output-on-failure --timeout "$TEST_TIMEOUT" ||
      fail "forward-path tests ($path)"
  done
fi
if want suite; then
  echo "==== the GPU suite, automatic forward path (fa3 where it serves)"
  ctest --test-dir "$BUILD" -L '^gpu$' -E '^fa[23]:' --output-on-failure --timeout "$TEST_TIMEOUT" ||
    fail "GPU suite"
fi

# One bench run: $1 = the forced path, $2 = the implementations.
bench() {
  echo "==== bench, forward only, FLASHATTN_CUDA_FORWARD=$1, $2"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of words
  FLASHATTN_CUDA_FORWARD=$1 timeout "$BENCH_TIMEOUT" python3 "$ROOT/bench/bench.py" --lib "$LIB" \
    --out "$RESULTS/bench-$1" --record '' --no-bwd --no-memory --no-sparse --dtypes bf16,fp16 --hdims 64,128,256 \
    --seqlens 1024,2048,4096,8192,16384 --impls "$2" ${BENCH_ARGS:-} || fail "bench ($1)"
}
if want bench; then
  bench fa3 lib-flash,cudnn
  bench fa2 lib-flash
fi
if want record; then
  echo "==== record: bench/results/h100.csv"
  if python3 "$ROOT/bench/record_h100.py" --ours "$RESULTS/bench-fa3/bench.csv" --fa2 "$RESULTS/bench-fa2/bench.csv"; then
    cp "$ROOT/bench/results/h100.csv" "$RESULTS/h100.csv"
  else
    fail "record_h100.py"
  fi
fi

[[ $FAILED == 0 ]] && echo "gpu_fa3_check: OK" || echo "gpu_fa3_check: FAILED (see above)"
exit $FAILED
