#!/usr/bin/env bash
# Builds the libFuzzer target (clang, ASan+UBSan, the library's CPU sources compiled in for
# coverage) and runs it for a bounded time on the committed seed corpus.
# Usage: run_fuzz.sh <build-dir> [seconds]    Exit status: 0 clean, 1 crash/violation, 77 no clang.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:?build dir}
secs=${2:-60}
CXX=${FUZZ_CXX:-clang++}
command -v "$CXX" >/dev/null || { echo "SKIP: $CXX not found (install clang and libclang-rt-14-dev)"; exit 77; }
mkdir -p "$out/corpus"
bin="$out/fuzz_plan"
# Every library source of the CPU build (src/*.cpp holds the API, validation and the
# no-CUDA stubs; the CUDA backend lives in src/cuda/), the reference and the target.
srcs=("$root"/src/*.cpp "$root"/src/cpu/*.cpp "$root"/reference/reference.cpp "$here"/fuzz_plan.cpp)
newest=$(ls -t "${srcs[@]}" "$root"/src/*.hpp "$root"/src/common/*.h "$root"/src/common/*.hpp "$root"/src/cpu/*.hpp "$root"/src/cpu/*.inl "$root"/reference/*.hpp | head -1)
if [ ! -x "$bin" ] || [ "$newest" -nt "$bin" ]; then
  echo "building $bin"
  "$CXX" -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$root/include" -I"$root/src" -I"$root/reference" -I"$root/tests" "${srcs[@]}" -o "$bin" -lpthread
fi
# Seeds are copied so the committed corpus is never modified by a run.
cp -n "$here"/corpus/* "$out/corpus/" 2>/dev/null || true
log="$out/fuzz.log"
set +e
# A fixed seed makes the bounded CI run explore a reproducible sequence of inputs (a prefix of
# what a longer run with the same seed explores); FUZZ_SEED=0 lets libFuzzer pick one.
ASAN_OPTIONS=detect_leaks=1 "$bin" -seed="${FUZZ_SEED:-1}" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$out/" "$out/corpus" >"$log" 2>&1
rc=$?
set -e
grep -E "^#[0-9]+.*(DONE|pulse)|stat::number_of_executed_units|stat::peak_rss|cov:" "$log" | tail -4
if [ $rc -ne 0 ]; then
  tail -40 "$log"
  echo "fuzzing FAILED (exit $rc); reproducer under $out/crash-*"
  exit 1
fi
echo "fuzzing clean for ${secs}s"
