"""Run by check_wheel.sh inside the fresh venv: the installed wheel imports, loads the
library it carries (not one from the build tree or the system), declares its license,
and computes a CPU forward pass equal to a float64 numpy reference."""
import os
import sys

import numpy as np

import flashattn

pkg = os.path.dirname(os.path.realpath(flashattn.__file__))
lib = os.path.realpath(flashattn.library_path())
if "site-packages" not in pkg or os.path.dirname(lib) != pkg:
    sys.exit("FAIL: flashattn from %s loaded %s; expected the library inside the installed package" % (pkg, lib))

from importlib import metadata  # noqa: E402

meta = metadata.metadata("libflashattn")
if meta.get("License-Expression") != "BSD-3-Clause":
    sys.exit("FAIL: the wheel's License-Expression is %r, not BSD-3-Clause" % meta.get("License-Expression"))

rng = np.random.default_rng(0)
b, sq, sk, h, d = 2, 37, 53, 4, 32
q = rng.standard_normal((b, sq, h, d)).astype(np.float32)
k = rng.standard_normal((b, sk, h, d)).astype(np.float32)
v = rng.standard_normal((b, sk, h, d)).astype(np.float32)
out = flashattn.forward(q, k, v, causal=True, align="bottom_right")

s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(d)
keep = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
s = np.where(keep, s, -np.inf)
p = np.exp(s - s.max(-1, keepdims=True))
p /= p.sum(-1, keepdims=True)
ref = np.einsum("bhqk,bkhd->bqhd", p, v.astype(np.float64))
err = float(np.abs(out - ref).max())
if not err < 1e-5:
    sys.exit("FAIL: max |out - reference| = %g" % err)
print("wheel OK: flashattn %s, library %s (%s), version %s, max error %.2e" % (
    flashattn.__version__, lib, "CUDA" if flashattn.has_cuda_backend() else "CPU only",
    ".".join(map(str, flashattn.version())), err))
