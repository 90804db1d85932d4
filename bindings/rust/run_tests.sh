#!/bin/sh
# Runs `cargo test --offline --features half` for the Rust workspace against one libflashattn
# build (CTest).
#   sh bindings/rust/run_tests.sh LIB_DIR [CARGO_TARGET_DIR]
# LIB_DIR holds libflashattn.so (link time) and libflashattn.so.0 (run time, found through
# the run path flashattn's build.rs embeds: no LD_LIBRARY_PATH). Without cargo, prints a
# skip line and exits 77 (CTest SKIP_RETURN_CODE).
set -u
if [ $# -lt 1 ]; then
  echo "usage: $0 LIB_DIR [CARGO_TARGET_DIR]" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bindings/rust/cargo_env.sh
. "$here/cargo_env.sh"
export FLASHATTN_LIB_DIR="$1"
if [ $# -ge 2 ]; then
  export CARGO_TARGET_DIR="$2"
fi
echo "FLASHATTN_LIB_DIR=$FLASHATTN_LIB_DIR"
cd "$here" && run_cargo test --offline --features half
