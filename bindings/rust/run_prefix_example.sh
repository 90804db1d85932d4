#!/bin/sh
# `cargo run --example forward` against an installed libflashattn, the way a user builds on
# a prefix install (CTest): no FLASHATTN_LIB_DIR, no LD_LIBRARY_PATH, only PKG_CONFIG_PATH.
#   sh bindings/rust/run_prefix_example.sh CMAKE BUILD_DIR WORK_DIR
# Installs BUILD_DIR into WORK_DIR/prefix, runs the example and checks that it loaded the
# prefix's library (through the run path flashattn's build.rs embeds). Without cargo or
# pkg-config, prints a skip line and exits 77.
set -eu
if [ $# -ne 3 ]; then
  echo "usage: $0 CMAKE BUILD_DIR WORK_DIR" >&2
  exit 2
fi
cmake=$1
build=$2
work=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bindings/rust/cargo_env.sh
. "$here/cargo_env.sh"
if ! command -v pkg-config >/dev/null 2>&1; then
  echo "SKIPPED: pkg-config not found (flashattn-sys finds an installed library through it)"
  exit 77
fi
rm -rf "$work/prefix"
"$cmake" --install "$build" --prefix "$work/prefix" >/dev/null
pc=$(find "$work/prefix" -name flashattn.pc | head -n 1)
[ -n "$pc" ] || { echo "no flashattn.pc under $work/prefix" >&2; exit 1; }
libdir=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --variable=libdir flashattn)
echo "prefix install: $work/prefix, library in $libdir"

unset FLASHATTN_LIB_DIR LD_LIBRARY_PATH
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
export CARGO_TARGET_DIR="$work/target"
cd "$here"
out=$(run_cargo run --offline --example forward)
echo "$out"
case "$out" in
  *"expected error"*) ;;
  *) echo "FAILED: the example did not run to its end" >&2; exit 1 ;;
esac
loaded=$(ldd "$CARGO_TARGET_DIR/debug/examples/forward" | grep 'libflashattn\.so')
echo "loader: $loaded"
case "$loaded" in
  *"=> $libdir/libflashattn.so"*) ;;
  *) echo "FAILED: the example does not load the prefix's library from $libdir" >&2; exit 1 ;;
esac
