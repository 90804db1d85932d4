#!/usr/bin/env bash
# The KV-cache / decode check on a GPU machine: build the library and test_gpu_inference,
# run the inference GPU tests, compute-sanitizer memcheck on a few of them (paged gather,
# append + rotary, device values out of range), the Python binding's CUDA KV-cache tests
# (flash_attn_with_kvcache on torch CUDA tensors), then bench/decode.py on the small grid
# (b 1/8/64, heads 32/8 and 32/32, d 128, 4k/32k keys, contiguous and pages of 16),
# appending rows to bench/results/h100-decode.csv. Prints a summary last; exits nonzero
# when a step fails.
#
# usage: scripts/gpu_decode_check.sh
# environment:
#   FLASHATTN_CUDA_ARCHITECTURES  CMake architecture list (default 90a-real)
#   BUILD_DIR                     build folder (default <repo>/build-gpu)
#   JOBS                          parallel build jobs (default 16)
#   STEPS                         comma-separated subset of build,tests,memcheck,python,bench (default all)
#   DECODE_GRID                   bench/decode.py --grid (default small; "issue" is the issue's grid)
#   PYTHON                        interpreter with torch (default python3)
#   OUT                           folder that receives the logs and the CSV when set
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
ARCHS=${FLASHATTN_CUDA_ARCHITECTURES:-90a-real}
JOBS=${JOBS:-16}
STEPS=${STEPS:-build,tests,memcheck,python,bench}
PY=${PYTHON:-python3}
LOGS=$BUILD/gpu-decode-check
CSV=$ROOT/bench/results/h100-decode.csv
mkdir -p "$LOGS"
want() { [[ ",$STEPS," == *",$1,"* ]]; }
SUMMARY=()
FAILED=0
record() { SUMMARY+=("$1|$2|$3"); [[ "$2" == FAIL ]] && FAILED=1; return 0; }
logged() {
  local name=$1; shift
  echo "==== $name: $*"
  "$@" 2>&1 | tee "$LOGS/$name.log"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$LOGS/device.txt"
if want build; then
  GEN=()
  command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
  if logged configure cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DFLASHATTN_ENABLE_CUDA=ON -DFLASHATTN_CUDA_ARCHITECTURES="$ARCHS" -DFLASHATTN_BUILD_DOCS=OFF \
      -DFLASHATTN_BUILD_TESTS=ON &&
     logged build cmake --build "$BUILD" -j "$JOBS" --target flashattn test_gpu_inference test_kvcache; then
    record build OK "archs=$ARCHS"
  else
    record build FAIL "see $LOGS/build.log"
  fi
  # Registers, spills and shared memory of the decode kernels.
  cuobjdump --dump-resource-usage "$BUILD/libflashattn.so.0" 2>/dev/null | grep -A1 -E 'decode|append' \
    > "$LOGS/resources.log" || true
fi

INFER=$(find "$BUILD" -maxdepth 3 -type f -name test_gpu_inference -perm -u+x 2>/dev/null | head -1)
if want tests; then
  if logged tests ctest --test-dir "$BUILD" -R 'gpu kvcache|gpu: combine|CUDA plans: KV-cache' --output-on-failure; then
    record tests OK "$(grep -Eo '[0-9]+ tests passed|[0-9]+% tests passed.*' "$LOGS/tests.log" | tail -1)"
  else
    record tests FAIL "$(grep -E 'Failed|\*\*\*' "$LOGS/tests.log" | head -3 | tr '\n' ' ' | cut -c1-200)"
  fi
fi

if want memcheck; then
  for spec in "gpu kvcache: decode over contiguous and paged caches with used lengths 0 and full" \
              "gpu kvcache: append with both rotary forms and causal or local chunked prefill" \
              "gpu kvcache: device values out of range give NaN rows and write nothing"; do
    name=memcheck-$(echo "$spec" | tr -c 'a-z0-9' '_' | cut -c1-40)
    if compute-sanitizer --tool memcheck --error-exitcode 99 "$INFER" "$spec" > "$LOGS/$name.log" 2>&1; then
      record "$name" OK "$(grep -Eo 'ERROR SUMMARY: [0-9]+ errors' "$LOGS/$name.log" | tail -1)"
    else
      record "$name" FAIL "$(grep -E 'ERROR SUMMARY|Invalid|failed' "$LOGS/$name.log" | head -2 | tr '\n' ' ' | cut -c1-200)"
    fi
  done
fi

if want python; then
  if FLASHATTN_LIBRARY=$BUILD/libflashattn.so.0 logged python "$PY" -m pytest -q -rs \
      "$ROOT/bindings/python/tests/test_torch_cuda.py" -k kvcache; then
    record python OK "$(grep -Eo '[0-9]+ passed.*' "$LOGS/python.log" | tail -1)"
  else
    record python FAIL "$(grep -E 'FAILED|Error' "$LOGS/python.log" | head -2 | tr '\n' ' ' | cut -c1-200)"
  fi
fi

if want bench; then
  if FLASHATTN_LIBRARY=$BUILD/libflashattn.so.0 logged bench "$PY" "$ROOT/bench/decode.py" \
      --grid "${DECODE_GRID:-small}" --out "$CSV"; then
    record bench OK "rows appended to $CSV"
  else
    record bench FAIL "see $LOGS/bench.log"
  fi
fi

if [[ -n "${OUT:-}" ]]; then
  mkdir -p "$OUT"
  cp -r "$LOGS" "$OUT/" 2>/dev/null || true
  [[ -f "$CSV" ]] && cp "$CSV" "$OUT/"
fi
echo
echo "==== gpu_decode_check summary"
for row in "${SUMMARY[@]}"; do
  IFS='|' read -r step result detail <<< "$row"
  printf '%-48s %-5s %s\n' "$step" "$result" "$detail"
done
exit $FAILED
