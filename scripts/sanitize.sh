#!/usr/bin/env bash
# Runs the CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer (preset
# `asan`) and the concurrency and unload tests under ThreadSanitizer (preset `tsan`).
#   bash scripts/sanitize.sh [asan|tsan|all]      (default: all)
# Called by scripts/test.sh, so CI runs it; exits nonzero on any sanitizer report.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
what=${1:-all}
jobs=$(nproc)
# Only tests of the library itself: bindings, examples and packaging load the library from
# tools that are not instrumented (python3, cargo, dpkg), and the fuzz test has its own
# ASan+UBSan build.
exclude_labels="packaging|bindings|examples|julia|header|fuzz|gpu|cli"

if [[ $what == asan || $what == all ]]; then
  cmake --preset asan
  # Every test program of tests/CMakeLists.txt (the fa_test_programs target) and the
  # reliability programs.
  cmake --build --preset asan --parallel "$jobs" --target fa_test_programs test_concurrency test_unload
  ctest --preset asan -LE "$exclude_labels"
fi
if [[ $what == tsan || $what == all ]]; then
  cmake --preset tsan
  cmake --build --preset tsan --parallel "$jobs" --target test_concurrency test_unload
  ctest --preset tsan -R 'reliability\.(concurrency|unload)'
fi
echo "sanitize: clean"
