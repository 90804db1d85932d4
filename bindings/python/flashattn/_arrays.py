"""Turning array objects into (pointer, shape, element strides, dtype, device) views.

Supported:
  * numpy.ndarray (host memory; the CPU backend);
  * torch.Tensor (CPU or CUDA), read through its own attributes (bf16 included);
  * anything with ``__cuda_array_interface__`` version 2 or 3 (CuPy, Numba, ...);
  * anything with ``__dlpack__`` / ``__dlpack_device__`` (read from the DLTensor).
Nothing here copies data: a view describes memory the caller owns.
"""
from __future__ import annotations

import ctypes
import math
import sys

from ._lib import DType, Status, make_error

# Element kinds besides the three attention dtypes.
F16, BF16, F32 = "fp16", "bf16", "fp32"
I32, U8, U16 = "int32", "uint8", "uint16"
_ITEMSIZE = {F16: 2, BF16: 2, F32: 4, I32: 4, U8: 1, U16: 2}

DTYPE_NAMES = {DType.FP16: F16, DType.BF16: BF16, DType.FP32: F32}
_DTYPE_ALIASES = {
    "fp16": DType.FP16, "float16": DType.FP16, "half": DType.FP16,
    "bf16": DType.BF16, "bfloat16": DType.BF16,
    "fp32": DType.FP32, "float32": DType.FP32, "float": DType.FP32,
}


def parse_dtype(dtype):
    """A flashattn DType from a DType, a name ('fp16', 'bf16', 'fp32', ...), or a numpy/torch dtype."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        try:
            return DType(dtype)
        except ValueError:
            pass
    name = str(dtype).lower().replace("torch.", "").replace("<class 'numpy.", "").rstrip("'>")
    if name in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[name]
    raise make_error(Status.INVALID_ENUM, "dtype=%r is not one of 'fp16', 'bf16', 'fp32'" % (dtype,))


class View:
    """Memory of one tensor argument.

    ptr: address (int); shape, strides: tuples (strides in elements); kind: element kind
    (fp16/bf16/fp32/int32/uint8/uint16); device: 'cpu' or ('cuda', ordinal or None);
    readonly: bool; owner: the object keeping the memory alive; stream: producer's
    stream hint (CAI) or None; framework: 'numpy', 'torch', 'cupy', 'cai', 'dlpack'.
    """

    __slots__ = ("name", "ptr", "shape", "strides", "kind", "device", "readonly", "owner", "framework", "keep")

    def __init__(self, name, ptr, shape, strides, kind, device, readonly, owner, framework, keep=None):
        self.name = name
        self.ptr = int(ptr)
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)
        self.kind = kind
        self.device = device
        self.readonly = readonly
        self.owner = owner
        self.framework = framework
        self.keep = keep

    @property
    def is_cuda(self):
        return self.device != "cpu"

    @property
    def itemsize(self):
        return _ITEMSIZE.get(self.kind, 0)

    def __repr__(self):
        return "View(%s shape=%s strides=%s kind=%s device=%s)" % (
            self.name, self.shape, self.strides, self.kind, self.device)


def _bytes_to_elems(name, byte_strides, itemsize):
    out = []
    for s in byte_strides:
        if s % itemsize:
            raise make_error(Status.INVALID_STRIDE, "%s: byte stride %d is not a multiple of the element size %d"
                             % (name, s, itemsize))
        out.append(s // itemsize)
    return tuple(out)


def _c_strides(shape):
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(st))


# ---- numpy ----

def _numpy_kind(name, dt, want):
    import numpy as np
    if dt == np.float16:
        return F16
    if dt == np.float32:
        return F32
    if dt == np.int32:
        return I32
    if dt == np.uint8:
        return U8
    if dt.name == "bfloat16" and dt.itemsize == 2:  # ml_dtypes.bfloat16 and friends
        return BF16
    if dt == np.uint16:
        if want == BF16:
            return BF16  # explicit: raw bfloat16 bits in a uint16 array
        return U16
    raise make_error(Status.DTYPE_NOT_SUPPORTED, "%s: numpy dtype %s is not supported (use float16, float32, "
                     "a bfloat16 dtype such as ml_dtypes.bfloat16, or uint16 bits with dtype='bf16')" % (name, dt))


def _from_numpy(name, a, want):
    kind = _numpy_kind(name, a.dtype, want)
    ptr = a.__array_interface__["data"][0]
    return View(name, ptr, a.shape, _bytes_to_elems(name, a.strides, a.itemsize), kind, "cpu",
                not a.flags.writeable, a, "numpy")


# ---- torch ----

def _is_torch(x):
    t = type(x)
    return t.__module__.split(".")[0] == "torch" and hasattr(x, "data_ptr") and hasattr(x, "stride")


def _from_torch(name, t, want):
    import torch
    kinds = {torch.float16: F16, torch.bfloat16: BF16, torch.float32: F32, torch.int32: I32, torch.uint8: U8}
    if t.dtype not in kinds:
        raise make_error(Status.DTYPE_NOT_SUPPORTED, "%s: torch dtype %s is not supported" % (name, t.dtype))
    if t.device.type == "cuda":
        dev = ("cuda", t.device.index if t.device.index is not None else torch.cuda.current_device())
    elif t.device.type == "cpu":
        dev = "cpu"
    else:
        raise make_error(Status.WRONG_MEMORY_SPACE, "%s: torch device %s is neither cpu nor cuda" % (name, t.device))
    return View(name, t.data_ptr(), tuple(t.shape), tuple(t.stride()), kinds[t.dtype], dev, False, t, "torch")


# ---- __cuda_array_interface__ ----

_TYPESTR = {"<f2": F16, "<f4": F32, "<i4": I32, "|u1": U8, "<u1": U8, "|i1": None, "<u2": U16}


def _from_cai(name, x, want):
    cai = x.__cuda_array_interface__
    ver = cai.get("version", 0)
    if ver < 2:
        raise make_error(Status.INVALID_ARGUMENT, "%s: __cuda_array_interface__ version %s is too old (need 2 or 3)"
                         % (name, ver))
    kind = _TYPESTR.get(cai["typestr"])
    if kind == U16 and want == BF16:
        kind = BF16
    if kind is None:
        raise make_error(Status.DTYPE_NOT_SUPPORTED, "%s: __cuda_array_interface__ typestr %r is not supported"
                         % (name, cai["typestr"]))
    shape = tuple(cai["shape"])
    ptr, readonly = cai["data"]
    strides = cai.get("strides")
    strides = _c_strides(shape) if strides is None else _bytes_to_elems(name, strides, _ITEMSIZE[kind])
    dev_id = None
    if type(x).__module__.split(".")[0] == "cupy":
        dev_id = int(x.device.id)
    return View(name, ptr or 0, shape, strides, kind, ("cuda", dev_id), bool(readonly), x,
                "cupy" if dev_id is not None else "cai")


# ---- DLPack ----

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST, _KDL_CUDA_MANAGED = 1, 2, 3, 13
_DL_KINDS = {(2, 16): F16, (2, 32): F32, (4, 16): BF16, (0, 32): I32, (1, 8): U8, (1, 16): U16}


def _capsule_pointer(capsule):
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return get(capsule, b"dltensor")


def _from_dlpack(name, x, want, stream):
    dev_type, dev_id = x.__dlpack_device__()
    if dev_type in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        # Ask the producer to make its work visible on our stream (1 = legacy default).
        capsule = x.__dlpack__(stream=stream if stream else 1)
    else:
        capsule = x.__dlpack__()
    addr = _capsule_pointer(capsule)
    t = _DLTensor.from_address(addr)  # DLManagedTensor starts with its DLTensor
    if t.dtype.lanes != 1 or (t.dtype.code, t.dtype.bits) not in _DL_KINDS:
        raise make_error(Status.DTYPE_NOT_SUPPORTED, "%s: DLPack dtype (code %d, bits %d, lanes %d) is not supported"
                         % (name, t.dtype.code, t.dtype.bits, t.dtype.lanes))
    kind = _DL_KINDS[(t.dtype.code, t.dtype.bits)]
    if kind == U16 and want == BF16:
        kind = BF16
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else _c_strides(shape)
    if t.device.device_type in (_KDL_CPU, _KDL_CUDA_HOST):
        dev = "cpu"
    elif t.device.device_type in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        dev = ("cuda", int(t.device.device_id))
    else:
        raise make_error(Status.WRONG_MEMORY_SPACE, "%s: DLPack device type %d is neither CPU nor CUDA"
                         % (name, t.device.device_type))
    ptr = (t.data or 0) + int(t.byte_offset)
    # The capsule (and with it the producer's memory) stays alive as long as the view.
    return View(name, ptr, shape, strides, kind, dev, False, x, "dlpack", keep=capsule)


def view(name, x, want=None, stream=None):
    """Describe array `x` (argument `name`); `want` is the expected element kind, used to
    accept uint16 arrays as raw bfloat16 bits when the plan's dtype is bf16."""
    if x is None:
        return None
    if isinstance(x, View):
        return x
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return _from_numpy(name, x, want)
    if _is_torch(x):
        return _from_torch(name, x, want)
    if hasattr(x, "__cuda_array_interface__"):
        return _from_cai(name, x, want)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return _from_dlpack(name, x, want, stream)
    if hasattr(x, "__array_interface__"):
        import numpy
        return _from_numpy(name, numpy.asarray(x), want)
    raise make_error(Status.INVALID_ARGUMENT, "%s: %s is not an array (need a numpy array, a torch tensor, or an "
                     "object with __cuda_array_interface__ or __dlpack__)" % (name, type(x).__name__))


def span_elems(shape, strides):
    """Number of elements from the first to one past the last addressed element."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides))


def is_dense(shape, strides):
    """True if the strides address every element exactly once in some dimension order."""
    dims = sorted((s, n) for n, s in zip(shape, strides) if n > 1)
    expect = 1
    for s, n in dims:
        if s != expect:
            return False
        expect *= n
    return True


def math_prod(xs):
    return math.prod(int(x) for x in xs)
