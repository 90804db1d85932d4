"""The compiled eager path of :func:`flashattn.attention` on torch tensors (optional).

    python -m flashattn.torch_ext build     # compile it for the installed torch (once)
    python -m flashattn.torch_ext status    # which path eager calls take, and why

A torch op in C++ (``csrc/torch_op.cpp``: the op ``flashattn_ext::attention`` with CPU
and CUDA kernels and a C++ autograd kernel) that serves the eager call on dense 4-D q,
k, v and on packed variable-length ones (3-D with cu_seqlens, whose values it never
reads: the library does), with causal or window masks, scale, softcap, GQA, bias and
bool or float masks with the bias's gradient, ALiBi slopes, dropout and block-sparse
layouts in host memory, without the Python autograd.Function's round trip: it calls the
same libflashattn the package loaded, with the same plan settings (and, with dropout,
the seed and offset the Python side drew from torch's generator for the call, kept for
the backward), so its results are bitwise those of the Python path. A layout in device
memory, every call with an input the Python path refuses in Python (it raises that
path's error), and every call under torch.compile take the Python path (the custom ops
``flashattn::fwd``/``bwd``).

Nothing is compiled at import: :func:`build` compiles the extension with
torch.utils.cpp_extension (a C++ compiler and ninja needed) into a folder keyed by the
torch version, the Python ABI, the library's version, the source, flashattn.h and the
link flags (the path of the process's libstdc++), under
``$FLASHATTN_TORCH_EXT_DIR`` (default ``$XDG_CACHE_HOME/flashattn/torch_ext``, i.e.
``~/.cache/flashattn/torch_ext``). The torch path loads a matching build from there at its
first call; ``FLASHATTN_TORCH_EXT=0`` turns that off (an explicit :func:`build` or
:func:`load` still turns it on). The compiled op binds itself once per process to the
loaded library, and refuses one whose version is not its flashattn.h's.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import sysconfig
import threading

from . import _lib

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(_HERE, "csrc", "torch_op.cpp")
ENV_OFF = "FLASHATTN_TORCH_EXT"
ENV_DIR = "FLASHATTN_TORCH_EXT_DIR"

_lock = threading.Lock()
_state = {"module": None, "path": None, "reason": "not looked for yet"}


def _header_dirs():
    """Where flashattn.h is looked for, in order: the package's csrc/ (a wheel ships it
    there), the source tree's include/, then the include folders of the library's prefix,
    of Python's prefix and of the system."""
    lib_dir = os.path.dirname(os.path.realpath(_lib.library_path()))
    dirs = [os.path.join(_HERE, "csrc"), os.path.join(_HERE, "..", "..", "..", "include"),
            os.path.join(lib_dir, "..", "include"),  # <prefix>/lib
            os.path.join(lib_dir, "..", "..", "include"),  # <prefix>/lib/<multiarch>
            os.path.join(sys.prefix, "include"), "/usr/local/include", "/usr/include"]
    return list(dict.fromkeys(os.path.normpath(d) for d in dirs))


def _header_dir():
    """The first folder of :func:`_header_dirs` that holds flashattn.h."""
    dirs = _header_dirs()
    for d in dirs:
        if os.path.isfile(os.path.join(d, "flashattn.h")):
            return d
    raise FileNotFoundError("flashattn.h not found (looked in %s)" % ", ".join(dirs))


def _link_flags():
    """The C++ runtime this process runs (torch's libraries need it), named by its path so
    that the extension links that shared library. Left to the compiler driver, some hosts
    link a static copy of the runtime into the extension (seen with Ubuntu 24.04's g++ 13
    beside torch 2.11: no libstdc++ among its needed libraries, the runtime's symbols
    exported by the module); that copy's stream locale is never set up, so formatting a
    number into an error message crashed the process. Empty where the process shows no
    libstdc++ (not Linux, or a runtime of another name). torch is imported first: its
    libraries map the runtime, so the answer does not depend on what ran before."""
    import torch  # noqa: F401
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libstdc++.so" in line}
    except OSError:
        return []
    paths = sorted(p for p in paths if os.path.basename(p).startswith("libstdc++.so") and os.path.isfile(p))
    return paths[:1]


def _source_digest():
    """A digest of what the build compiles and links: the op's source, the flashattn.h it
    includes and the link flags."""
    h = hashlib.sha256()
    for path in (SOURCE, os.path.join(_header_dir(), "flashattn.h")):
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(repr(_link_flags()).encode())
    return h.hexdigest()[:12]


def build_dir():
    """The folder of the build for this torch, Python, library, source and header."""
    import torch
    root = os.environ.get(ENV_DIR) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "flashattn", "torch_ext")
    tag = "torch%s-%s-lib%d.%d.%d-%s" % (torch.__version__.replace("+", "_"), sys.implementation.cache_tag,
                                          *_lib.library_version(), _source_digest())
    return os.path.join(root, tag)


def _module_name():
    return "flashattn_torch_ext"


def _built_file(folder):
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    for name in (_module_name() + suffix, _module_name() + ".so"):
        p = os.path.join(folder, name)
        if os.path.isfile(p):
            return p
    return None


def build(verbose=False):
    """Compile the extension for the installed torch into :func:`build_dir` (a no-op when
    it is there) and turn it on; returns the path of the compiled module."""
    import torch.utils.cpp_extension as cpp
    folder = build_dir()
    if _built_file(folder) is None:
        os.makedirs(folder, exist_ok=True)
        mod = cpp.load(name=_module_name(), sources=[SOURCE], extra_include_paths=[_header_dir()],
                       extra_cflags=["-O2"], extra_ldflags=_link_flags(), build_directory=folder, verbose=verbose,
                       is_python_module=True)
        _activate(_built_file(folder), mod)
    else:
        _activate(_built_file(folder))
    return _built_file(folder)


def load():
    """Turn on the build in :func:`build_dir` if there is one; returns whether it is on."""
    path = _built_file(build_dir())
    if path is None:
        with _lock:
            _state["reason"] = "not built for this torch, Python and library: run python -m flashattn.torch_ext build"
        return False
    _activate(path)
    return True


def _activate(path, mod=None):
    """Import the compiled module at path (unless given), bind it to the loaded library and
    send eager calls through it."""
    with _lock:
        if _state["module"] is not None:
            return
        mod = mod or sys.modules.get(_module_name())
        if mod is None:
            import torch  # noqa: F401  (the extension links against torch's libraries)
            spec = importlib.util.spec_from_file_location(_module_name(), path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        sys.modules[_module_name()] = mod
        mod.init(_lib.library_path())
        _state.update(module=mod, path=path, reason="on")
    from . import _torch_ops
    _torch_ops.use_extension(mod)


def disable():
    """Send every eager call down the Python path again (the op stays registered)."""
    from . import _torch_ops
    _torch_ops.use_extension(None)
    with _lock:
        _state.update(module=None, path=None, reason="turned off by disable()")


def load_at_first_call():
    """What the torch path runs once: :func:`load` unless FLASHATTN_TORCH_EXT=0; a failure
    to load leaves the Python path on and is reported by :func:`status`."""
    if os.environ.get(ENV_OFF, "") == "0":
        with _lock:
            _state["reason"] = "turned off by %s=0" % ENV_OFF
        return
    try:
        load()
    except Exception as e:  # a stale or broken build must not break attention()
        with _lock:
            _state["reason"] = "could not load the build: %s: %s" % (type(e).__name__, e)


def status():
    """{"active": bool, "path": the compiled module or None, "reason": why (not)}."""
    with _lock:
        return {"active": _state["module"] is not None, "path": _state["path"], "reason": _state["reason"]}


def _main(argv):
    cmd = argv[0] if argv else "status"
    if cmd == "build":
        print(build(verbose="-v" in argv))
    elif cmd == "status":
        load_at_first_call()
        s = status()
        print("active: %s\nreason: %s\npath: %s\nbuild folder: %s" % (s["active"], s["reason"], s["path"],
                                                                      build_dir()))
    else:
        print("usage: python -m flashattn.torch_ext [build [-v] | status]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
