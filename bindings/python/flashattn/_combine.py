"""flashattn.combine: the merge of partial attention results (``flashattn_combine``) for
numpy arrays (CPU backend) and torch/CuPy/DLPack arrays on the CPU or a CUDA device."""
from __future__ import annotations

import ctypes

from . import _arrays as A
from . import _lib as L
from ._lib import Backend, Status, make_error
from ._plan import _default_stream, _keep_alive_on_stream, _stream_value, alloc

_KIND_DTYPES = {kind: dt for dt, kind in A.DTYPE_NAMES.items()}


def _i64(vals):
    return (ctypes.c_int64 * len(vals))(*vals)


def _same_memory(v, ref):
    """Raise WRONG_MEMORY_SPACE unless view v lives where view ref does."""
    if v.is_cuda != ref.is_cuda or (v.is_cuda and None not in (v.device[1], ref.device[1])
                                    and v.device[1] != ref.device[1]):
        raise make_error(Status.WRONG_MEMORY_SPACE, "%s is on %s but o_partial is on %s"
                         % (v.name, v.device, ref.device))


def _fp32(v):
    if v.kind != A.F32:
        raise make_error(Status.DTYPE_NOT_SUPPORTED, "%s has element type %s; partial results are float32"
                         % (v.name, v.kind))


def combine(o_partial, lse_partial, *, out=None, lse=None, dtype=None, want_lse=True, stream=None):
    """Merge partial attention results over a split of the keys; returns (out, lse).

    o_partial: float32 (splits, batch, seqlen_q, heads, head_dim); lse_partial: float32
    (splits, batch, heads, seqlen_q); any strides with a contiguous last dimension (slices
    of larger buffers work). Per row, over the parts whose lse is not -inf:
    lse = log sum_i exp(lse_i), out = sum_i exp(lse_i - lse) o_i; a row with no such part
    gets out = 0 and lse = -inf.

    out: (batch, seqlen_q, heads, head_dim) in any attention dtype and strides (dim stride
    1), allocated like o_partial (C-contiguous, `dtype`, default float32) when not given.
    lse: float32 (batch, heads, seqlen_q) C-contiguous, allocated unless want_lse=False.
    CUDA arrays run asynchronously on `stream` (default: the current torch/CuPy stream);
    the CPU backend takes no stream."""
    sv = None if stream is None else _stream_value(stream)
    ov = A.view("o_partial", o_partial, A.F32, sv)
    lv = A.view("lse_partial", lse_partial, A.F32, sv)
    if ov is None or lv is None:
        raise make_error(Status.NULL_POINTER, "%s is required" % ("o_partial" if ov is None else "lse_partial"))
    _fp32(ov)
    _fp32(lv)
    if len(ov.shape) != 5:
        raise make_error(Status.INVALID_SHAPE, "o_partial has shape %s; it must be (splits, batch, seqlen_q, heads, "
                         "head_dim)" % (ov.shape,))
    n, b, s, h, d = ov.shape
    if lv.shape != (n, b, h, s):
        raise make_error(Status.INVALID_SHAPE, "lse_partial has shape %s; with o_partial %s it must be %s "
                         "(splits, batch, heads, seqlen_q)" % (lv.shape, ov.shape, (n, b, h, s)))
    _same_memory(lv, ov)
    want = None if dtype is None else A.DTYPE_NAMES[A.parse_dtype(dtype)]
    if out is None:
        out = alloc(ov, (b, s, h, d), A._c_strides((b, s, h, d)), want or A.F32)
    outv = A.view("out", out, want, sv)
    if outv.kind not in _KIND_DTYPES:
        raise make_error(Status.DTYPE_NOT_SUPPORTED, "out has element type %s; it must be fp16, bf16 or fp32"
                         % outv.kind)
    if want is not None and outv.kind != want:
        raise make_error(Status.INVALID_ARGUMENT, "out has element type %s but dtype=%r" % (outv.kind, dtype))
    if outv.shape != (b, s, h, d):
        raise make_error(Status.INVALID_SHAPE, "out has shape %s; with o_partial %s it must be %s "
                         "(batch, seqlen_q, heads, head_dim)" % (outv.shape, ov.shape, (b, s, h, d)))
    _same_memory(outv, ov)
    if outv.readonly:
        raise make_error(Status.INVALID_ARGUMENT, "out is read-only")
    if lse is None and want_lse:
        lse = alloc(ov, (b, h, s), A._c_strides((b, h, s)), A.F32)
    lsev = None
    if lse is not None:
        lsev = A.view("lse", lse, A.F32, sv)
        _fp32(lsev)
        if lsev.shape != (b, h, s):
            raise make_error(Status.INVALID_SHAPE, "lse has shape %s; it must be %s (batch, heads, seqlen_q)"
                             % (lsev.shape, (b, h, s)))
        _same_memory(lsev, ov)
        if lsev.readonly:
            raise make_error(Status.INVALID_ARGUMENT, "lse is read-only")
    if ov.is_cuda:
        backend, device = Backend.CUDA, ov.device[1] if ov.device[1] is not None else 0
        s_ptr = sv if stream is not None else _default_stream([ov])
    else:
        if sv:
            raise make_error(Status.INVALID_ARGUMENT, "stream=%#x: the CPU backend runs synchronously and takes no "
                             "stream" % sv)
        backend, device, s_ptr = Backend.CPU, 0, 0
    ost, lst, outst = _i64(ov.strides), _i64(lv.strides), _i64(outv.strides)
    args = L.CombineArgs(num_splits=n, batch=b, seqlen_q=s, heads=h, head_dim=d, o_partial=ov.ptr,
                         o_partial_strides=ost, lse_partial=lv.ptr, lse_partial_strides=lst,
                         dtype=int(_KIND_DTYPES[outv.kind]), o=outv.ptr, o_strides=outst,
                         lse=lsev.ptr if lsev is not None else None)
    L.check(L.lib().flashattn_combine(int(backend), device, ctypes.byref(args), s_ptr or None), "flashattn_combine")
    if backend == Backend.CUDA:
        _keep_alive_on_stream([out, lse], s_ptr)
    return out, lse
