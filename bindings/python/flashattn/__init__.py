"""flashattn: Python bindings (ctypes) for libflashattn, exact IO-aware attention.

    import numpy as np, flashattn
    q = np.random.randn(2, 128, 8, 64).astype(np.float32)   # (batch, seq, heads, dim)
    out = flashattn.forward(q, q, q, causal=True)

The shared library libflashattn.so.0 is found through FLASHATTN_LIBRARY (a file or a
directory), then beside this package, then the system loader. See README.md.
"""
from __future__ import annotations

import sys

from ._lib import (ABI_MAJOR, ABI_MINOR, MAX_HEAD_DIM, SONAME, WINDOW_UNBOUNDED, Algorithm, Align, Backend, Bias,
                   DType, DeviceError, FlashAttnError, InternalError, InvalidArgumentError, LibraryNotFoundError,
                   NotSupportedError, Pass, ResourceError, Rotary, Status, Tensor, error_class, last_error,
                   library_path, library_version, status_string)
from ._combine import combine
from ._kvcache import forward_kvcache, make_kvcache_plan
from ._plan import Plan, backward, forward, make_plan

__version__ = "0.1.0"


def version():
    """(major, minor, patch) of the loaded C library."""
    return library_version()


def cuda_device_count():
    """CUDA devices usable by the library (0 for a CPU-only build or no driver)."""
    from . import _lib
    return int(_lib.lib().flashattn_cuda_device_count())


def has_cuda_backend():
    """True if the loaded library was built with CUDA."""
    from . import _lib
    return bool(_lib.lib().flashattn_has_cuda_backend())


def attention(q, k, v, **kwargs):
    """Attention for torch tensors: differentiable, torch.compile-able, with SDPA-style
    masks and autocast (see :func:`flashattn._torch.attention`); for other arrays it is
    :func:`forward`. Options as for :func:`forward`."""
    torch = sys.modules.get("torch")  # a torch tensor implies torch is imported
    if torch is not None and isinstance(q, torch.Tensor):
        fn = _torch_attention or _load_torch_attention()
        return fn(q, k, v, **kwargs)
    return forward(q, k, v, **kwargs)


_torch_attention = None


def _load_torch_attention():
    global _torch_attention
    from ._torch import attention as fn
    _torch_attention = fn
    return fn


__all__ = [
    "ABI_MAJOR", "ABI_MINOR", "MAX_HEAD_DIM", "SONAME", "WINDOW_UNBOUNDED", "Algorithm", "Align", "Backend", "Bias",
    "DType", "DeviceError", "FlashAttnError", "InternalError", "InvalidArgumentError", "LibraryNotFoundError",
    "NotSupportedError", "Pass", "Plan", "ResourceError", "Rotary", "Status", "Tensor", "attention", "backward",
    "combine", "cuda_device_count", "error_class", "forward", "forward_kvcache", "has_cuda_backend", "last_error",
    "library_path", "library_version", "make_kvcache_plan", "make_plan", "status_string", "version",
]
