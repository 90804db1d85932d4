"""Loading libflashattn.so.0 through ctypes: discovery, prototypes, status codes, errors.

Discovery order (first hit wins):
  1. the environment variable FLASHATTN_LIBRARY: a path to the library file, or a
     directory that contains libflashattn.so.0;
  2. libflashattn.so.0 (or libflashattn.so) beside this package's files;
  3. the system loader: ctypes.CDLL("libflashattn.so.0") (LD_LIBRARY_PATH, ld.so.cache),
     then whatever ctypes.util.find_library("flashattn") names.
The loaded library's major version must equal ABI_MAJOR, and its minor version must be
at least ABI_MINOR (the functions this binding calls exist from that version on).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import enum
import os
import threading

#: Major version (SONAME) of the C library this binding speaks to.
ABI_MAJOR = 0
#: Oldest minor version that has every function this binding calls.
ABI_MINOR = 1
#: File name of the shared library (SONAME).
SONAME = "libflashattn.so.%d" % ABI_MAJOR

_ENV_VAR = "FLASHATTN_LIBRARY"


class Status(enum.IntEnum):
    """flashattn_status_t. Values are part of the ABI and never renumbered."""

    SUCCESS = 0
    INVALID_ARGUMENT = 100
    NULL_POINTER = 101
    INVALID_SHAPE = 102
    INVALID_HEADS = 103
    INVALID_STRIDE = 104
    INVALID_ENUM = 105
    INVALID_VALUE = 106
    INVALID_LAYOUT = 107
    INVALID_STRUCT_SIZE = 108
    WORKSPACE_TOO_SMALL = 109
    PLAN_INCOMPLETE = 110
    INCOMPATIBLE_OPTIONS = 111
    INVALID_SEQLENS = 112
    MISALIGNED_POINTER = 113
    NOT_SUPPORTED = 200
    BACKEND_UNAVAILABLE = 201
    HEAD_DIM_NOT_SUPPORTED = 202
    DTYPE_NOT_SUPPORTED = 203
    LIBRARY_UNAVAILABLE = 204
    OUT_OF_MEMORY = 300
    CUDA_ERROR = 400
    NO_DEVICE = 401
    LAUNCH_FAILED = 402
    WRONG_MEMORY_SPACE = 403
    INTERNAL_ERROR = 900


class Backend(enum.IntEnum):
    """flashattn_backend_t."""

    AUTO = 0
    CPU = 1
    CUDA = 2


class DType(enum.IntEnum):
    """flashattn_dtype_t."""

    FP16 = 0
    BF16 = 1
    FP32 = 2


class Tensor(enum.IntEnum):
    """flashattn_tensor_t: which tensor a stride setting applies to."""

    Q = 0
    K = 1
    V = 2
    O = 3
    DO = 4
    DQ = 5
    DK = 6
    DV = 7


class Algorithm(enum.IntEnum):
    """flashattn_algorithm_t."""

    FLASH = 0
    STANDARD = 1


class Align(enum.IntEnum):
    """flashattn_mask_align_t."""

    TOP_LEFT = 0
    BOTTOM_RIGHT = 1


class Bias(enum.IntEnum):
    """flashattn_bias_t."""

    NONE = 0
    TENSOR = 1
    ALIBI = 2
    ALIBI_SYMMETRIC = 3


class Pass(enum.IntEnum):
    """flashattn_pass_t."""

    FORWARD = 0
    BACKWARD = 1
    FORWARD_KVCACHE = 2


class Rotary(enum.IntEnum):
    """flashattn_rotary_t."""

    NONE = 0
    HALF = 1
    INTERLEAVED = 2


#: FLASHATTN_MAX_HEAD_DIM
MAX_HEAD_DIM = 256
#: FLASHATTN_WINDOW_UNBOUNDED
WINDOW_UNBOUNDED = -1


# ---------------------------------------------------------------- errors


class FlashAttnError(Exception):
    """A libflashattn call (or a check the binding makes before one) failed.

    Attributes:
        status: the status code, a :class:`Status` (an ``int``) when the code is known,
            else a plain ``int``.
        status_name: the library's name for it, e.g. ``"FLASHATTN_STATUS_INVALID_SHAPE"``.
        message: the library's message (``flashattn_last_error()``), naming the argument
            and its value, or the binding's own message for checks made in Python.
        function: the C function that failed, or None for checks made in Python.
    """

    def __init__(self, status, message, function=None, status_name=None):
        try:
            status = Status(int(status))
        except ValueError:
            status = int(status)
        self.status = status
        self.status_name = status_name or _status_name_fallback(status)
        self.message = message
        self.function = function
        where = "%s: " % function if function else ""
        super().__init__("%s%s (%s, status %d)" % (where, message, self.status_name, int(status)))


class InvalidArgumentError(FlashAttnError, ValueError):
    """Status 1xx: an argument (shape, stride, value, pointer, seqlens, ...) is invalid."""


class NotSupportedError(FlashAttnError, NotImplementedError):
    """Status 2xx: valid, but not supported by this backend or build."""


class ResourceError(FlashAttnError, MemoryError):
    """Status 3xx: a host allocation failed."""


class DeviceError(FlashAttnError, RuntimeError):
    """Status 4xx: CUDA runtime, device or memory-space failure."""


class InternalError(FlashAttnError, RuntimeError):
    """Status 9xx (or anything unknown): a bug in the library."""


class LibraryNotFoundError(ImportError):
    """libflashattn.so.0 could not be found or has an incompatible version."""


def _status_name_fallback(status):
    try:
        return "FLASHATTN_STATUS_" + Status(int(status)).name
    except ValueError:
        return "FLASHATTN_STATUS_UNKNOWN"


def error_class(status):
    """The :class:`FlashAttnError` subclass used for a status code."""
    s = int(status)
    if 100 <= s < 200:
        return InvalidArgumentError
    if 200 <= s < 300:
        return NotSupportedError
    if 300 <= s < 400:
        return ResourceError
    if 400 <= s < 500:
        return DeviceError
    return InternalError


def make_error(status, message, function=None):
    """Build the exception for a status raised by Python-side checks."""
    return error_class(status)(status, message, function)


# ---------------------------------------------------------------- ctypes types


class FwdArgs(ctypes.Structure):
    """flashattn_fwd_args_t (field order and types exactly as in flashattn.h)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("alibi_slopes", ctypes.c_void_p),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
    ]

    def __init__(self, **kw):
        super().__init__(struct_size=ctypes.sizeof(FwdArgs), **kw)


class BwdArgs(ctypes.Structure):
    """flashattn_bwd_args_t (field order and types exactly as in flashattn.h)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("dout", ctypes.c_void_p),
        ("dq", ctypes.c_void_p),
        ("dk", ctypes.c_void_p),
        ("dv", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("dbias", ctypes.c_void_p),
        ("alibi_slopes", ctypes.c_void_p),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
    ]

    def __init__(self, **kw):
        super().__init__(struct_size=ctypes.sizeof(BwdArgs), **kw)


class KvcacheConfig(ctypes.Structure):
    """flashattn_kvcache_config_t (field order and types exactly as in flashattn.h)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("page_size", ctypes.c_int64),
        ("num_rows", ctypes.c_int64),
        ("max_pages_per_seq", ctypes.c_int64),
        ("k_cache_strides", ctypes.POINTER(ctypes.c_int64)),
        ("v_cache_strides", ctypes.POINTER(ctypes.c_int64)),
        ("seqlen_new", ctypes.c_int64),
        ("k_new_strides", ctypes.POINTER(ctypes.c_int64)),
        ("v_new_strides", ctypes.POINTER(ctypes.c_int64)),
        ("rotary", ctypes.c_int),
        ("rotary_dim", ctypes.c_int64),
        ("rotary_rows", ctypes.c_int64),
        ("num_splits", ctypes.c_int64),
    ]

    def __init__(self, **kw):
        super().__init__(struct_size=ctypes.sizeof(KvcacheConfig), **kw)


class KvcacheArgs(ctypes.Structure):
    """flashattn_kvcache_args_t (field order and types exactly as in flashattn.h)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("q", ctypes.c_void_p),
        ("k_cache", ctypes.c_void_p),
        ("v_cache", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("cache_seqlens", ctypes.c_void_p),
        ("cache_batch_idx", ctypes.c_void_p),
        ("block_table", ctypes.c_void_p),
        ("k_new", ctypes.c_void_p),
        ("v_new", ctypes.c_void_p),
        ("rotary_cos", ctypes.c_void_p),
        ("rotary_sin", ctypes.c_void_p),
        ("alibi_slopes", ctypes.c_void_p),
    ]

    def __init__(self, **kw):
        super().__init__(struct_size=ctypes.sizeof(KvcacheArgs), **kw)


class CombineArgs(ctypes.Structure):
    """flashattn_combine_args_t (field order and types exactly as in flashattn.h)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("num_splits", ctypes.c_int64),
        ("batch", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("o_partial", ctypes.c_void_p),
        ("o_partial_strides", ctypes.POINTER(ctypes.c_int64)),
        ("lse_partial", ctypes.c_void_p),
        ("lse_partial_strides", ctypes.POINTER(ctypes.c_int64)),
        ("dtype", ctypes.c_int),
        ("o", ctypes.c_void_p),
        ("o_strides", ctypes.POINTER(ctypes.c_int64)),
        ("lse", ctypes.c_void_p),
    ]

    def __init__(self, **kw):
        super().__init__(struct_size=ctypes.sizeof(CombineArgs), **kw)


_c_int = ctypes.c_int
_c_i64 = ctypes.c_int64
_c_u64 = ctypes.c_uint64
_c_float = ctypes.c_float
_c_size_p = ctypes.POINTER(ctypes.c_size_t)
_c_int_p = ctypes.POINTER(ctypes.c_int)
_i64x4 = ctypes.c_int64 * 4
_vp = ctypes.c_void_p

# name -> (restype, argtypes). Enums are passed as C int.
PROTOTYPES = {
    "flashattn_get_version": (_c_int, [_c_int_p, _c_int_p, _c_int_p]),
    "flashattn_status_string": (ctypes.c_char_p, [_c_int]),
    "flashattn_last_error": (ctypes.c_char_p, []),
    "flashattn_plan_create": (_c_int, [ctypes.POINTER(_vp), _c_int, _c_int]),
    "flashattn_plan_destroy": (None, [_vp]),
    "flashattn_plan_get_backend": (_c_int, [_vp, _c_int_p]),
    "flashattn_plan_set_shape": (_c_int, [_vp, _c_i64, _c_i64, _c_i64, _c_i64, _c_i64, _c_i64, _c_i64]),
    "flashattn_plan_set_dtype": (_c_int, [_vp, _c_int]),
    "flashattn_plan_set_strides": (_c_int, [_vp, _c_int, ctypes.POINTER(_c_i64)]),
    "flashattn_plan_set_softmax_scale": (_c_int, [_vp, _c_float]),
    "flashattn_plan_set_algorithm": (_c_int, [_vp, _c_int]),
    "flashattn_plan_set_varlen": (_c_int, [_vp, _c_int, _c_i64, _c_i64]),
    "flashattn_plan_set_deterministic": (_c_int, [_vp, _c_int]),
    "flashattn_plan_set_grad_accumulate": (_c_int, [_vp, _c_int]),
    "flashattn_plan_set_band_mask": (_c_int, [_vp, _c_int, _c_i64, _c_i64]),
    "flashattn_plan_set_softcap": (_c_int, [_vp, _c_float]),
    "flashattn_plan_set_bias": (_c_int, [_vp, _c_int, ctypes.POINTER(_c_i64)]),
    "flashattn_plan_set_alibi_batch_stride": (_c_int, [_vp, _c_i64]),
    "flashattn_plan_set_dropout": (_c_int, [_vp, _c_float, _c_u64, _c_u64]),
    "flashattn_plan_set_block_sparse": (_c_int, [_vp, _vp, _c_i64, _c_i64, _c_i64, _c_i64, _c_i64]),
    "flashattn_plan_get_workspace_size": (_c_int, [_vp, _c_int, _c_size_p]),
    "flashattn_fwd": (_c_int, [_vp, ctypes.POINTER(FwdArgs), _vp, ctypes.c_size_t, _vp]),
    "flashattn_bwd": (_c_int, [_vp, ctypes.POINTER(BwdArgs), _vp, ctypes.c_size_t, _vp]),
    "flashattn_plan_set_kvcache": (_c_int, [_vp, ctypes.POINTER(KvcacheConfig)]),
    "flashattn_fwd_kvcache": (_c_int, [_vp, ctypes.POINTER(KvcacheArgs), _vp, ctypes.c_size_t, _vp]),
    "flashattn_combine": (_c_int, [_c_int, _c_int, ctypes.POINTER(CombineArgs), _vp]),
    "flashattn_cuda_device_count": (_c_int, []),
    "flashattn_has_cuda_backend": (_c_int, []),
}


# ---------------------------------------------------------------- loading


def _candidates():
    """(description, path-or-name) pairs in discovery order."""
    out = []
    env = os.environ.get(_ENV_VAR)
    if env:
        if os.path.isdir(env):
            out.append(("%s (directory)" % _ENV_VAR, os.path.join(env, SONAME)))
        else:
            out.append((_ENV_VAR, env))
        return out  # an explicit choice is never silently replaced by another library
    here = os.path.dirname(os.path.abspath(__file__))
    for name in (SONAME, "libflashattn.so"):
        p = os.path.join(here, name)
        if os.path.exists(p):
            out.append(("beside the package", p))
    out.append(("system loader", SONAME))
    found = ctypes.util.find_library("flashattn")
    if found:
        out.append(("ctypes.util.find_library", found))
    return out


def _bind(lib):
    for name, (restype, argtypes) in PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as e:
            raise LibraryNotFoundError("%s lacks the symbol %s" % (lib._name, name)) from e
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def _version_of(lib):
    major, minor, patch = ctypes.c_int(-1), ctypes.c_int(-1), ctypes.c_int(-1)
    lib.flashattn_get_version.restype = ctypes.c_int
    lib.flashattn_get_version.argtypes = [_c_int_p, _c_int_p, _c_int_p]
    lib.flashattn_get_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
    return major.value, minor.value, patch.value


def load_library():
    """Find, load and check libflashattn; returns (CDLL, path, (major, minor, patch))."""
    tried = []
    for how, path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s: %s (%s)" % (how, path, e))
            continue
        if not hasattr(lib, "flashattn_get_version"):
            tried.append("%s: %s is not libflashattn (no flashattn_get_version)" % (how, path))
            continue
        ver = _version_of(lib)
        if ver[0] != ABI_MAJOR or ver[1] < ABI_MINOR:
            msg = "%s: %s has version %d.%d.%d; this binding needs %d.x with x >= %d" % (
                how, path, ver[0], ver[1], ver[2], ABI_MAJOR, ABI_MINOR)
            if how.startswith(_ENV_VAR):
                raise LibraryNotFoundError(msg)
            tried.append(msg)
            continue
        return _bind(lib), path, ver
    raise LibraryNotFoundError(
        "could not load %s; set %s to its path. Tried:\n  %s" % (SONAME, _ENV_VAR, "\n  ".join(tried)))


_lock = threading.Lock()
_state = {}


def lib():
    """The loaded library (loaded on first use)."""
    st = _state.get("lib")
    if st is None:
        with _lock:
            if "lib" not in _state:
                l, path, ver = load_library()
                _state["path"], _state["version"] = path, ver
                _state["lib"] = l
            st = _state["lib"]
    return st


def library_path():
    """Path (or loader name) of the loaded library."""
    lib()
    return _state["path"]


def library_version():
    """(major, minor, patch) of the loaded library."""
    lib()
    return _state["version"]


def status_string(status):
    """flashattn_status_string: the library's name for a status code."""
    return lib().flashattn_status_string(int(status)).decode()


def last_error():
    """flashattn_last_error on the calling thread."""
    return lib().flashattn_last_error().decode(errors="replace")


def check(status, function):
    """Raise the FlashAttnError subclass for a non-zero status of `function`."""
    if status == 0:
        return
    msg = last_error()
    raise error_class(status)(status, msg or "(no message)", function, status_string(status))


def call(name, *args):
    """Call a status-returning C function and raise on failure."""
    check(getattr(lib(), name)(*args), name)
