#!/usr/bin/env bash
# The one script to run on a GPU machine: configure + build everything, report each
# kernel's registers, local memory (spills) and static shared memory, run the GPU tests
# (also under smaller devices' shared-memory limits and on the sm_80 code), compute-sanitizer
# (memcheck, racecheck, synccheck) on a representative subset or the whole GPU suite, and the
# benchmark against PyTorch SDPA; copies logs/CSV/JSON/PNG to $OUT when set and prints a
# summary table LAST. Works from a clean checkout (it configures its own build folder).
#
# usage: scripts/gpu_check.sh [quick|full]
#   quick (default): bench --quick (bf16, d=64/128, seqlen 1k/4k/16k) + verification
#   full:            full bench sweep (bf16+fp16, d=64/128/256, seqlen 512..16k) and the
#                    CPU-labelled tests as well
# Timing on one H100: quick ~2.5 min in all (build ~20 s with ninja -j16, GPU tests ~25 s,
# sanitizers ~30 s, bench ~90 s). Measured per step group (2026-11-22, H100, fresh build
# ~20 s each): STEPS=tests,sanitize-suite ~6 min (the slow GPU cases ~3.5 min of it);
# STEPS=caps,sm80,sanitize ~4.5-6 min; STEPS=bench full, one dtype ~2.5 min; the multi-tile
# test_gpu cases added since take longer. Everything in one run is ~15 min: where a command
# has a time limit, split it along these groups, and log to a file under $OUT rather than
# piping through `tail` (a killed pipe returns nothing).
# environment:
#   FLASHATTN_CUDA_ARCHITECTURES  CMake architecture list (default 90a-real: the H100/H200 code)
#   BUILD_DIR                     build folder (default <repo>/build-gpu)
#   JOBS                          parallel build jobs (default 16)
#   SANITIZE_TESTS                Catch2 test spec of test_gpu cases to run under the
#                                 sanitizers (default: GQA/MQA, the STANDARD algorithm with
#                                 options, and the deterministic backward over several tiles;
#                                 skipped if none match)
#   BENCH_ARGS                    extra arguments for bench/bench.py
#   CMAKE_ARGS                    extra arguments for the CMake configure step
#   CTEST_ARGS                    extra arguments for ctest, split on spaces (e.g. -E long.sequences)
#   STEPS                         comma-separated steps to run after the build (default all:
#                                 resources,tests,caps,sm80,sanitize,bench); e.g. STEPS=tests,caps,sanitize
#                                 and STEPS=sm80,bench split a full check over two runs;
#                                 STEPS=sanitize-suite runs the three compute-sanitizer tools over
#                                 every non-slow GPU test case (not a default step)
#   SMEM_CAPS                     FLASHATTN_CUDA_SMEM_LIMIT values of the caps step
#                                 (default "166912 101376")
#   OUT                           folder that receives summary.txt, gpu-check-logs.tar.gz
#                                 and bench.csv/json/png
set -u -o pipefail

MODE=${1:-quick}
case "$MODE" in quick|full) ;; *) echo "usage: $0 [quick|full]" >&2; exit 2 ;; esac
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
ARCHS=${FLASHATTN_CUDA_ARCHITECTURES:-90a-real}
JOBS=${JOBS:-16}
SANITIZE_TESTS=${SANITIZE_TESTS:-"gpu: GQA and MQA,gpu: STANDARD algorithm matches the reference,gpu: deterministic backward over several tiles with masks and varlen"}
LOGS=$BUILD/gpu-check
mkdir -p "$LOGS"

STEPS=${STEPS:-resources,tests,caps,sm80,sanitize,bench}
want() { [[ ",$STEPS," == *",$1,"* ]]; }
SUMMARY=()   # "step|result|detail"
FAILED=0
record() { SUMMARY+=("$1|$2|$3"); [[ "$2" == FAIL ]] && FAILED=1; return 0; }
secs() { echo $(( $(date +%s) - $1 )); }

# Runs "$@" with its output in $LOGS/<name>.log (and on the console); returns its status.
logged() {
  local name=$1; shift
  echo "==== $name: $*"
  "$@" 2>&1 | tee "$LOGS/$name.log"   # pipefail: the status is the command's
}

echo "gpu_check: mode=$MODE build=$BUILD archs=$ARCHS jobs=$JOBS"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$LOGS/device.txt"

# ---------------------------------------------------------------- configure + build
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
t0=$(date +%s)
# shellcheck disable=SC2086  # CMAKE_ARGS is a list of words
if logged configure cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_ENABLE_CUDA=ON -DFLASHATTN_CUDA_ARCHITECTURES="$ARCHS" \
    -DFLASHATTN_BUILD_DOCS=OFF -DFLASHATTN_BUILD_TESTS=ON ${CMAKE_ARGS:-}; then
  record configure OK "archs=$ARCHS"
  CONFIGURED=1
else
  record configure FAIL "see $LOGS/configure.log"
  CONFIGURED=0
fi

BUILT=0
if [[ $CONFIGURED == 1 ]]; then
  t0=$(date +%s)
  if logged build cmake --build "$BUILD" -j "$JOBS"; then
    record build OK "$(secs "$t0") s, -j$JOBS"
    BUILT=1
  else
    record build FAIL "$(grep -m3 -E 'error|Error' "$LOGS/build.log" | tr '\n' ' ' | cut -c1-160)"
    # Keep going with what does build: the library and the CLI are enough for the
    # sanitizer runs and the benchmark (a broken test file should not hide them).
    if logged build_lib cmake --build "$BUILD" -j "$JOBS" --target flashattn flashattn_cli; then
      record "build (library + CLI only)" OK "tests not built"
      BUILT=1
      NO_TESTS=1
    fi
  fi
fi

LIB=$BUILD/libflashattn.so.0
CLI=$(find "$BUILD" -maxdepth 3 -type f -name flashattn -perm -u+x 2>/dev/null | head -1)
TEST_GPU=$(find "$BUILD" -maxdepth 3 -type f -name test_gpu -perm -u+x 2>/dev/null | head -1)

# ---------------------------------------------------------------- linkage
if [[ $BUILT == 1 && -f "$LIB" ]]; then
  needed=$(readelf -d "$LIB" | awk '/NEEDED/ {gsub(/[\[\]]/, "", $5); print $5}' | tr '\n' ' ')
  echo "NEEDED: $needed" | tee "$LOGS/linkage.log"
  if echo "$needed" | grep -Eq 'libcublas|libcudart|libcuda\.so'; then
    record linkage FAIL "NEEDED has CUDA libraries: $needed"
  else
    record linkage OK "NEEDED: $needed"
  fi
fi

# ---------------------------------------------------------------- resources
# Registers, local memory (spill stores land there) and static shared memory of every
# kernel in the library, per embedded architecture, from its cubins (no GPU needed):
# resources.log lists them all, the summary the register maximum and the kernels that use
# local memory. Compare it before and after a kernel change, next to the timings.
if [[ $BUILT == 1 && -f "$LIB" ]] && want resources; then
  CUOBJDUMP=$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")
  DEMANGLE=(cat)
  command -v c++filt >/dev/null 2>&1 && DEMANGLE=(c++filt)
  if [[ -x "$CUOBJDUMP" ]] && "$CUOBJDUMP" --dump-resource-usage "$LIB" > "$LOGS/resources.raw" 2>&1; then
    awk '/^arch = / { arch = $3 }
         /^ Function / { name = substr($2, 1, length($2) - 1) }
         /^  REG:/ { split($0, f, /[ :]+/)
                     for (i = 1; i < length(f); i++) v[f[i]] = f[i + 1]
                     printf "%-7s %4s %6s %7s %s\n", arch, v["REG"], v["LOCAL"], v["SHARED"], name }' \
      "$LOGS/resources.raw" | "${DEMANGLE[@]}" | sort -u > "$LOGS/resources.body"
    { printf '%-7s %4s %6s %7s %s\n' arch regs local shared kernel; cat "$LOGS/resources.body"; } |
      tee "$LOGS/resources.log"
    nkern=$(wc -l < "$LOGS/resources.body")
    maxreg=$(awk 'BEGIN { m = 0 } $2 > m { m = $2 } END { print m }' "$LOGS/resources.body")
    spills=$(awk '$3 > 0 { n++ } END { print n + 0 }' "$LOGS/resources.body")
    if [[ $nkern == 0 ]]; then
      record resources FAIL "no kernel found in $LIB (see resources.raw)"
    else
      record resources OK "$nkern kernel/arch pairs, max $maxreg registers, $spills with local memory (resources.log)"
    fi
  else
    record resources SKIP "cuobjdump not found or failed (see resources.raw)"
  fi
fi

# ---------------------------------------------------------------- tests
ctest_counts() {  # "passed/failed/skipped of total" from a ctest log
  local log=$1 total failed skipped
  # ctest prints "N% tests passed, F tests failed out of T", or "100% tests passed out of T".
  total=$(grep -Eo 'tests (passed |failed )?out of [0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
  failed=$(grep -Eo '[0-9]+ tests failed' "$log" | grep -Eo '^[0-9]+' | tail -1)
  skipped=$(grep -c '\*\*\*Skipped\|Not Run' "$log")
  total=${total:-0}; failed=${failed:-0}
  echo "$(( total - failed - skipped )) passed, $failed failed, $skipped skipped of $total"
}
if [[ $BUILT == 1 && -z "${NO_TESTS:-}" ]] && want tests; then
  # shellcheck disable=SC2086  # CTEST_ARGS is a list of words
  if logged ctest_gpu ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 600 ${CTEST_ARGS:-}; then
    if grep -q 'No tests were found' "$LOGS/ctest_gpu.log"; then
      record "tests (gpu)" SKIP "no gpu-labelled tests in this build"
    else
      record "tests (gpu)" OK "$(ctest_counts "$LOGS/ctest_gpu.log")"
    fi
  else
    record "tests (gpu)" FAIL "$(ctest_counts "$LOGS/ctest_gpu.log")"
  fi
  if [[ $MODE == full ]]; then
    if logged ctest_cpu ctest --test-dir "$BUILD" -LE gpu --output-on-failure -j "$JOBS" --timeout 900; then
      record "tests (other)" OK "$(ctest_counts "$LOGS/ctest_cpu.log")"
    else
      record "tests (other)" FAIL "$(ctest_counts "$LOGS/ctest_cpu.log")"
    fi
  fi
fi

# ---------------------------------------------------------------- shared-memory caps
# The GPU tests again with FLASHATTN_CUDA_SMEM_LIMIT capping the backward's opt-in shared
# memory per block, so this GPU takes the kernel choices of smaller devices: 166912 = A100 /
# sm_87 (1 stage at d=128/256), 101376 = sm_86/sm_89/sm_120 (small-tile variants). At
# 101376 the test_gpu cases with a backward above d=192 (their names match $OVER_99KB) are
# left out: that backward is refused there by design (no tile of the kernel fits 99 KB);
# test_gpu_smem covers every head-dim config at that limit, that refusal included. The
# [slow] limit cases (128k sequences, >2^31-element tensors) run once above, not again
# under each cap.
OVER_99KB="head dims 32 to 256|head dim 256"
if [[ $BUILT == 1 && -z "${NO_TESTS:-}" ]] && want caps; then
  for cap in ${SMEM_CAPS:-166912 101376}; do
    excl=()
    [[ $cap == 101376 ]] && excl=(-E "$OVER_99KB")
    # shellcheck disable=SC2086
    if FLASHATTN_CUDA_SMEM_LIMIT=$cap logged "ctest_gpu_smem$cap" ctest --test-dir "$BUILD" -L gpu -LE slow \
        --output-on-failure --timeout 600 "${excl[@]}" ${CTEST_ARGS:-}; then
      record "tests (gpu, smem cap $cap)" OK "$(ctest_counts "$LOGS/ctest_gpu_smem$cap.log")"
    else
      record "tests (gpu, smem cap $cap)" FAIL "$(ctest_counts "$LOGS/ctest_gpu_smem$cap.log")"
    fi
  done
fi

# ---------------------------------------------------------------- sm_80 code
# A100/sm_86/sm_89 run the kernels' sm_80 code paths (no dQ staging, the pre-sm_90
# reductions and elementwise code), which SASS built for sm_90 never executes. A second
# build embeds only compute_80 PTX; the driver JIT-compiles
# it for this GPU, so __CUDA_ARCH__ is 800 in every kernel, and the GPU tests run on it
# (without the [slow] and the limits cases), plain and with the 99 KB cap.
if [[ $BUILT == 1 && -z "${NO_TESTS:-}" ]] && want sm80; then
  B80=$BUILD-sm80ptx
  t0=$(date +%s)
  # shellcheck disable=SC2086
  if logged configure80 cmake -S "$ROOT" -B "$B80" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_ENABLE_CUDA=ON \
      -DFLASHATTN_CUDA_ARCHITECTURES=80-virtual -DFLASHATTN_BUILD_DOCS=OFF -DFLASHATTN_BUILD_TESTS=ON \
      -DFLASHATTN_BUILD_EXAMPLES=OFF ${CMAKE_ARGS:-} >/dev/null &&
     logged build80 cmake --build "$B80" -j "$JOBS" >/dev/null; then
    record "build (compute_80 PTX)" OK "$(secs "$t0") s"
    export CUDA_CACHE_MAXSIZE=4294967296  # the JIT cache keeps each kernel's compilation for later processes
    for cap in none 101376; do
      # The limits cases test host-side sizes and faults, which do not depend on the code.
      excl=(-E "gpu limits")
      [[ $cap == 101376 ]] && excl=(-E "gpu limits|$OVER_99KB")
      envs=()
      [[ $cap != none ]] && envs=("FLASHATTN_CUDA_SMEM_LIMIT=$cap")
      # shellcheck disable=SC2086
      if logged "ctest_sm80_$cap" env "${envs[@]}" ctest --test-dir "$B80" -L gpu -LE slow --output-on-failure \
          --timeout 900 "${excl[@]}" ${CTEST_ARGS:-}; then
        record "tests (sm_80 code, cap $cap)" OK "$(ctest_counts "$LOGS/ctest_sm80_$cap.log")"
      else
        record "tests (sm_80 code, cap $cap)" FAIL "$(ctest_counts "$LOGS/ctest_sm80_$cap.log")"
      fi
    done
  else
    record "build (compute_80 PTX)" FAIL "see $LOGS/build80.log"
  fi
fi

# ---------------------------------------------------------------- compute-sanitizer
# Representative subset: the CLI's own checks (flash and standard, fwd+bwd, odd lengths,
# GQA, causal bottom-right, dropout, ALiBi, block-sparse) and the test_gpu cases matching
# $SANITIZE_TESTS. Result: the tool's "ERROR SUMMARY" (the program's own verdict too).
sanitize() {  # tool name args...
  local tool=$1 name=$2; shift 2
  local log="$LOGS/san_${tool}_${name}.log"
  echo "==== compute-sanitizer --tool $tool: $*"
  # san_limit (seconds, 0 = none) bounds one run; the sanitize-suite step sets it.
  timeout --signal=KILL "${san_limit:-0}" compute-sanitizer --tool "$tool" --error-exitcode 99 "$@" > "$log" 2>&1
  local rc=$?
  local errs  # memcheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)"
  errs=$(grep -Eo 'ERROR SUMMARY: [0-9]+|RACECHECK SUMMARY: .*\([0-9]+ errors' "$log" | grep -Eo '[0-9]+( errors)?$' |
         grep -Eo '^[0-9]+' | tail -1)
  tail -3 "$log"
  if [[ $rc == 137 && -n "${san_limit:-}" && "${san_limit:-0}" != 0 ]]; then
    record "$tool $name" FAIL "killed at the ${san_limit} s limit, ${errs:-no} errors so far (see $(basename "$log"))"
  elif [[ $rc == 99 || ( -n "$errs" && "$errs" != 0 ) ]]; then
    record "$tool $name" FAIL "${errs:-?} errors (see $(basename "$log"))"
  elif [[ -z "$errs" ]]; then
    record "$tool $name" FAIL "no ERROR SUMMARY, exit $rc (see $(basename "$log"))"
  elif [[ $rc != 0 ]]; then
    # Clean under the tool, but the program itself failed (check FAIL / library error).
    record "$tool $name" FAIL "0 sanitizer errors, but the program exited $rc"
  else
    record "$tool $name" OK "0 errors"
  fi
}
SMALL=(--batch 2 --seqlen-q 67 --seqlen-k 131 --heads-q 4 --heads-kv 2 --head-dim 64 --dtype bf16 --bwd)
if ! want sanitize; then
  :
elif [[ $BUILT == 1 ]] && command -v compute-sanitizer >/dev/null 2>&1; then
  if [[ -n "$CLI" ]]; then
    for tool in memcheck racecheck; do
      sanitize "$tool" flash-causal "$CLI" check --backend cuda --algorithm flash "${SMALL[@]}" --causal=bottom-right
      sanitize "$tool" standard-options "$CLI" check --backend cuda --algorithm standard "${SMALL[@]}" \
        --causal=bottom-right --dropout 0.1 --alibi
    done
    sanitize memcheck flash-sparse-dropout "$CLI" check --backend cuda --algorithm flash \
      --batch 1 --seqlen-q 300 --heads-q 2 --head-dim 128 --dtype fp16 --bwd --block-sparse 0.5 --dropout 0.2
    sanitize memcheck flash-sparse-d256 "$CLI" check --backend cuda --algorithm flash \
      --batch 1 --seqlen-q 200 --seqlen-k 170 --heads-q 2 --head-dim 256 --dtype bf16 --bwd --block-sparse 0.5
    FLASHATTN_CUDA_SMEM_LIMIT=101376 sanitize memcheck flash-small-tiles "$CLI" check --backend cuda \
      --algorithm flash --batch 1 --seqlen-q 150 --seqlen-k 90 --heads-q 2 --head-dim 128 --dtype fp16 --bwd \
      --block-sparse 0.5 --dropout 0.2
    sanitize memcheck standard-softcap "$CLI" check --backend cuda --algorithm standard \
      --batch 1 --seqlen-q 100 --seqlen-k 37 --heads-q 2 --head-dim 256 --dtype fp32 --bwd --softcap 4 --window 8,3
  else
    record sanitizers FAIL "the flashattn CLI was not built"
  fi
  if [[ -n "$TEST_GPU" ]]; then
    listing=$("$TEST_GPU" --list-tests "$SANITIZE_TESTS" 2>&1)
    if ! grep -Eqi 'no test cases matched|^ *0 matching' <<<"$listing" && grep -Eqi 'matching test case' <<<"$listing"; then
      sanitize memcheck test_gpu-subset "$TEST_GPU" "$SANITIZE_TESTS"
      sanitize racecheck test_gpu-subset "$TEST_GPU" "$SANITIZE_TESTS"
    else
      record "sanitize test_gpu" SKIP "no test_gpu case matches '$SANITIZE_TESTS'"
    fi
  fi
elif [[ $BUILT == 1 ]]; then
  record sanitizers SKIP "compute-sanitizer not found"
fi

# ---------------------------------------------------------------- synccheck
# compute-sanitizer --tool synccheck (a barrier reached by only part of a block, invalid
# __syncwarp / shuffle / ballot masks) over the same subset: the CLI's flash checks (causal,
# block-sparse with dropout), the STANDARD check with options, and the test_gpu cases of
# $SANITIZE_TESTS. Same verdict rules as above ("ERROR SUMMARY: 0 errors" and exit 0).
if [[ $BUILT == 1 ]] && want sanitize && command -v compute-sanitizer >/dev/null 2>&1; then
  if [[ -n "$CLI" ]]; then
    sanitize synccheck flash-causal "$CLI" check --backend cuda --algorithm flash "${SMALL[@]}" --causal=bottom-right
    sanitize synccheck flash-sparse-dropout "$CLI" check --backend cuda --algorithm flash \
      --batch 1 --seqlen-q 300 --heads-q 2 --head-dim 128 --dtype fp16 --bwd --block-sparse 0.5 --dropout 0.2
    sanitize synccheck standard-options "$CLI" check --backend cuda --algorithm standard "${SMALL[@]}" \
      --causal=bottom-right --dropout 0.1 --alibi
  fi
  if [[ -n "$TEST_GPU" ]] && grep -Eqi 'matching test case' <<<"${listing:-}" &&
      ! grep -Eqi 'no test cases matched|^ *0 matching' <<<"${listing:-}"; then
    sanitize synccheck test_gpu-subset "$TEST_GPU" "$SANITIZE_TESTS"
  fi
fi

# ---------------------------------------------------------------- sanitize-suite
# Every non-slow case of every GPU test program under memcheck, racecheck and synccheck
# (STEPS=sanitize-suite, not a default step: it takes several device minutes). The [stream]
# case leaves a CUDA API error pending on purpose, which memcheck would report; it is
# left out.
# The twelve runs (4 programs x 3 tools) go SAN_JOBS at a time (default 6; the tools are
# bound by host-side bookkeeping, the GPU is mostly idle), each under SAN_TIMEOUT seconds
# (default 480): a run cut off there is a FAIL naming the timeout, not a pass.
if [[ $BUILT == 1 ]] && want sanitize-suite && command -v compute-sanitizer >/dev/null 2>&1; then
  san_jobs=${SAN_JOBS:-6}
  san_timeout=${SAN_TIMEOUT:-480}
  t0=$(date +%s)
  names=()
  for prog in test_gpu test_gpu_numerics test_gpu_smem test_gpu_limits; do
    bin=$(find "$BUILD" -maxdepth 3 -type f -name "$prog" -perm -u+x 2>/dev/null | head -1)
    if [[ -z "$bin" ]]; then
      record "sanitize-suite $prog" FAIL "not built"
      continue
    fi
    for tool in memcheck racecheck synccheck; do
      while (( $(jobs -rp | wc -l) >= san_jobs )); do wait -n; done
      names+=("${tool}_$prog-suite")
      # In a subshell: its record() line goes to a file, collected below in a fixed order.
      ( SUMMARY=()
        san_limit=$san_timeout sanitize "$tool" "$prog-suite" "$bin" "~[slow]~[stream]" > /dev/null
        printf '%s\n' "${SUMMARY[-1]}" > "$LOGS/san_result_${tool}_$prog-suite" ) &
    done
  done
  wait
  for n in "${names[@]}"; do
    if [[ -s "$LOGS/san_result_$n" ]]; then
      IFS='|' read -r step result detail < "$LOGS/san_result_$n"
      record "$step" "$result" "$detail"
    else
      record "$n" FAIL "no result"
    fi
  done
  echo "sanitize-suite: $(secs "$t0") s"
fi

# ---------------------------------------------------------------- benchmark
BENCH_OUT=$LOGS/bench
if ! want bench; then
  :
elif [[ $BUILT == 1 ]] && python3 -c 'import torch' 2>/dev/null; then
  QUICK=(--quick)
  [[ $MODE == full ]] && QUICK=()
  mkdir -p "$BENCH_OUT"
  # shellcheck disable=SC2086
  if logged bench python3 "$ROOT/bench/bench.py" --lib "$LIB" --out "$BENCH_OUT" --verify "${QUICK[@]}" \
      --record "$BENCH_OUT/sweep.csv" ${BENCH_ARGS:-}; then
    record bench OK "$(grep -m1 '== verification' "$LOGS/bench.log" | sed 's/== //')"
  else
    record bench FAIL "$(grep -m1 '== verification' "$LOGS/bench.log" | sed 's/== //') (see bench.log)"
  fi
elif [[ $BUILT == 1 ]]; then
  record bench SKIP "PyTorch is not importable"
fi

# ---------------------------------------------------------------- summary (last)
summary() {
  echo "================================ gpu_check summary ($MODE) ================================"
  if [[ -f "$LOGS/bench.log" ]]; then
    # The bench's own compact tables (verification failures, memory, sparse, TFLOP/s).
    sed -n '/^==== bench results/,$p' "$LOGS/bench.log" | grep -v '^  PASS' | head -150
    echo
  fi
  printf '%-34s %-5s %s\n' STEP RESULT DETAIL
  for line in "${SUMMARY[@]}"; do
    IFS='|' read -r step result detail <<<"$line"
    printf '%-34s %-5s %s\n' "$step" "$result" "$detail"
  done
}
summary > "$LOGS/summary.txt"
if [[ -n "${OUT:-}" ]]; then
  # Few files (the device tool returns at most 8): summary, logs as one archive, bench outputs.
  mkdir -p "$OUT"
  cp "$LOGS/summary.txt" "$OUT/"
  tar -C "$LOGS" -czf "$OUT/gpu-check-logs.tar.gz" --exclude=bench . 2>/dev/null
  for f in bench.csv bench.json bench.png; do
    [[ -f "$BENCH_OUT/$f" ]] && cp "$BENCH_OUT/$f" "$OUT/"
  done
fi
echo
cat "$LOGS/summary.txt"
[[ -n "${OUT:-}" ]] && echo "copied summary.txt, gpu-check-logs.tar.gz and bench outputs to $OUT"
exit $FAILED
