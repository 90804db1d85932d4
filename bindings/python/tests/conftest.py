"""Test setup: import the in-tree package and find the library to test.

The library is taken from FLASHATTN_LIBRARY (CTest sets it to the build tree's
libflashattn.so.0); without it, the most recently built build*/libflashattn.so.0 of this
checkout is used, so `pytest bindings/python/tests` works right after a build.
"""
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PKG_ROOT))
sys.path.insert(0, PKG_ROOT)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "reference"))  # reference.py, the Python fp64 reference

# The tests of the Python torch path run on that path even where the compiled extension
# is built; test_torch_ext.py turns the extension on itself.
os.environ.setdefault("FLASHATTN_TORCH_EXT", "0")

if not os.environ.get("FLASHATTN_LIBRARY"):
    found = sorted(glob.glob(os.path.join(REPO, "build*", "libflashattn.so.0")), key=os.path.getmtime)
    if found:
        os.environ["FLASHATTN_LIBRARY"] = found[-1]
