#!/bin/sh
# Runs the Julia package's tests (test/runtests.jl) against one libflashattn build (CTest).
#   sh bindings/julia/run_tests.sh LIBRARY_FILE
# The module reads FLASHATTN_LIBRARY when it is compiled, so it is loaded without cached
# compiled modules: always this library. Without julia, prints a skip line and exits 77
# (CTest SKIP_RETURN_CODE).
set -u
if [ $# -ne 1 ]; then
  echo "usage: $0 LIBRARY_FILE" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
julia=$(command -v julia 2>/dev/null || true)
if [ -z "$julia" ]; then
  echo "SKIPPED: julia not found (the Julia binding's tests need a Julia runtime, 1.6 or newer)"
  exit 77
fi
echo "julia binding: $("$julia" --version), FLASHATTN_LIBRARY=$1"
FLASHATTN_LIBRARY=$1 exec "$julia" --compiled-modules=no --project="$here" "$here/test/runtests.jl"
