#!/bin/sh
# Runs `cargo test --offline` for the Rust workspace against one libflashattn build (CTest).
#   sh bindings/rust/run_tests.sh LIB_DIR [CARGO_TARGET_DIR]
# LIB_DIR holds libflashattn.so (link time) and libflashattn.so.0 (run time). Without
# cargo, prints a skip line and exits 77 (CTest SKIP_RETURN_CODE).
set -u
if [ $# -lt 1 ]; then
  echo "usage: $0 LIB_DIR [CARGO_TARGET_DIR]" >&2
  exit 2
fi
lib_dir=$1
here=$(cd "$(dirname "$0")" && pwd)
cargo=$(command -v cargo 2>/dev/null || true)
if [ -z "$cargo" ] && [ -x "${CARGO_HOME:-${HOME:-/nonexistent}/.cargo}/bin/cargo" ]; then
  cargo="${CARGO_HOME:-$HOME/.cargo}/bin/cargo"
fi
if [ -z "$cargo" ]; then
  echo "SKIPPED: cargo not found (the Rust binding's tests need a Rust toolchain)"
  exit 77
fi
export FLASHATTN_LIB_DIR="$lib_dir"
export LD_LIBRARY_PATH="$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ $# -ge 2 ]; then
  export CARGO_TARGET_DIR="$2"
fi
echo "rust binding: $("$cargo" --version), FLASHATTN_LIB_DIR=$lib_dir"
cd "$here" && exec "$cargo" test --offline
