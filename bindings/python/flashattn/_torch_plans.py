"""The thin call path for torch tensors: a cache of C plans keyed by everything a plan
depends on (shapes, strides, dtypes, devices, options), and one C call per pass.

A cache miss builds the plan through :func:`flashattn._plan.make_plan` and checks every
argument once (shapes, dtypes, devices, strides); a hit only allocates the outputs
through torch (the caching allocator on CUDA), packs the argument struct and calls
``flashattn_fwd``/``flashattn_bwd`` on the current torch stream. An autograd backward
runs on the entry its forward looked up (:func:`run_backward`), with no second lookup
unless its saved tensors came back with another layout (:func:`input_layout`).
Nothing here synchronizes with the device, so runs can be captured in a CUDA graph.

Thread safety: lookups read the dict without a lock (one atomic ``dict.get``); a miss
builds and inserts under a lock, so eviction never races another insertion. An entry
stays valid after eviction for as long as a caller holds it.
"""
from __future__ import annotations

import ctypes
import struct
import threading

import torch

from . import _lib as L
from ._lib import Pass, Status, Tensor, make_error
from ._plan import _dense_like, make_plan

#: Plans kept at most; the oldest is dropped first (its C plan is destroyed once no run uses it).
CACHE_SIZE = 1024

# The argument structs, packed from integers: field for field flashattn_fwd_args_t and
# flashattn_bwd_args_t (struct_size, then pointers).
_FWD_ARGS = struct.Struct("@N9P")
_BWD_ARGS = struct.Struct("@N14P")
assert _FWD_ARGS.size == ctypes.sizeof(L.FwdArgs) and _BWD_ARGS.size == ctypes.sizeof(L.BwdArgs)
_FWD_SIZE, _BWD_SIZE = _FWD_ARGS.size, _BWD_ARGS.size

_cache = {}
_cache_lock = threading.Lock()
_cfuncs = {}
_host = threading.local()
_raw_stream = torch._C._cuda_getCurrentRawStream  # cudaStream_t of torch's current stream on a device


def _cfunc(name):
    """A private function object for `name` that takes the argument struct as packed bytes."""
    f = _cfuncs.get(name)
    if f is None:
        f = L.lib()[name]
        f.restype = ctypes.c_int
        f.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        _cfuncs[name] = f
    return f


def layouts(q_shape, q_stride, k_shape, k_stride, v_shape, v_stride):
    """(shape, strides) of out, dq, dk, dv and the shape of lse for q, k, v of these shapes
    and strides: 4-D (batch, seq, heads, dim), or 3-D (tokens, heads, dim) when packed.
    Outputs are dense in the dimension order of their input. Used by the runs and by the
    fake (meta) implementations alike."""
    packed = len(q_shape) == 3
    pre = (0,) if packed else ()
    q4, k4, v4 = pre + tuple(q_shape), pre + tuple(k_shape), pre + tuple(v_shape)
    qs4, ks4, vs4 = pre + tuple(q_stride), pre + tuple(k_stride), pre + tuple(v_stride)
    o4 = q4[:3] + (v4[3],)
    res = []
    for shp, st in ((o4, qs4), (q4, qs4), (k4, ks4), (v4, vs4)):
        strides = _dense_like(shp, st)
        res.append((shp[len(pre):], strides[len(pre):]))
    lse = (q4[2], q4[1]) if packed else (q4[0], q4[2], q4[1])
    return res[0], res[1], res[2], res[3], lse


def _contiguous_strides(shape):
    """The strides torch gives a contiguous tensor of this shape."""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _has_layout(t, layout):
    """Whether tensor t has exactly this (shape, strides)."""
    return tuple(t.shape) == layout[0] and t.stride() == layout[1]


def _desc(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


class _Entry:
    """One cached plan with the output layouts and workspace sizes of its passes."""
    # Mirrored in csrc/torch_op.cpp (build_plan, for every plan but backward_into's);
    # test_torch_ext.py checks the two agree bitwise.

    __slots__ = ("plan", "handle", "cuda", "out", "grads", "lse", "dbias", "ws_fwd", "ws_bwd", "dropout_p", "lock",
                 "out_like_q", "grads_like_inputs", "input_layout")

    def __init__(self, q, k, v, bias, alibi_slopes, cu_q, cu_k, block_layout, opts, into=None):
        (max_q, max_k, left, right, bottom_right, scale, softcap, alibi_symmetric, dropout_p, block_q, block_k,
         deterministic, algorithm) = opts
        block_sparse = None
        if block_layout is not None:
            block_sparse = (block_layout.detach().cpu().numpy(), block_q, block_k)
        plan, info = make_plan(
            q, k, v, window=(left if left >= 0 else None, right if right >= 0 else None),
            align="bottom_right" if bottom_right else "top_left", scale=scale or None, softcap=softcap or None,
            bias=bias, alibi_slopes=alibi_slopes, alibi_symmetric=alibi_symmetric, dropout_p=dropout_p, seed=0,
            block_sparse=block_sparse, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
            max_seqlen_q=max_q if cu_q is not None else None, max_seqlen_k=max_k if cu_k is not None else None,
            deterministic=deterministic, algorithm=algorithm)
        try:
            backend = plan.backend
            plan._common_inputs(backend, bias, alibi_slopes, cu_q, cu_k, None)
            self.out, dq, dk, dv, lse = layouts(q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride())
            self.lse = (lse, _contiguous_strides(lse))
            self.grads = (dq, dk, dv)
            # torch.empty_like(t) parses less than new_empty_strided and gives t's strides
            # when t is dense: used where those are exactly the layout wanted.
            self.out_like_q = _has_layout(q, self.out)
            self.grads_like_inputs = all(_has_layout(t, g) for t, g in ((q, dq), (k, dk), (v, dv)))
            self.input_layout = input_layout(q, k, v, bias, alibi_slopes, cu_q, cu_k)
            packed = info["varlen"]
            given = {}
            if into is not None:  # backward_into: the strides of its out, dout and gradients, accumulating or not
                given = dict(zip((Tensor.O, Tensor.DO, Tensor.DQ, Tensor.DK, Tensor.DV), into[1]))
                plan.set_grad_accumulate(into[0])
            for t, (shp, st) in ((Tensor.O, self.out), (Tensor.DO, self.out), (Tensor.DQ, dq), (Tensor.DK, dk),
                                 (Tensor.DV, dv)):
                st = given.get(t, st)
                plan.set_strides(t, ((0,) + st) if packed else st)
            self.dbias = None
            if bias is not None:
                self.dbias = (tuple(bias.shape), plan._bias_strides)
            self.ws_fwd = plan.workspace_size(Pass.FORWARD)
            self.ws_bwd = plan.workspace_size(Pass.BACKWARD)
        except BaseException:
            plan.close()
            raise
        adopt(self, plan, backend, dropout_p)


def input_layout(q, k, v, bias, alibi_slopes, cu_q, cu_k):
    """The shape, strides, dtype and device of every tensor input a plan reads with the
    layout it was made for: an entry runs only on tensors that have them
    (:func:`run_backward`'s callers check; saved-tensor hooks may return copies)."""
    return tuple(_desc(t) for t in (q, k, v, bias, alibi_slopes, cu_q, cu_k))


def adopt(entry, plan, backend, dropout_p):
    """Give a cache entry the plan and the fields :func:`_run` reads (handle, cuda,
    dropout_p, lock)."""
    entry.plan = plan
    entry.handle = plan.handle.value
    entry.cuda = backend == "cuda"
    entry.dropout_p = dropout_p
    entry.lock = threading.Lock()


def entry(q, k, v, bias, alibi_slopes, cu_q, cu_k, block_layout, opts):
    """The cached plan for these tensors and options (built and checked on a miss)."""
    key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
           v.shape, v.stride(), v.dtype, v.device, opts)
    if bias is not None or alibi_slopes is not None or cu_q is not None or cu_k is not None:
        key += (_desc(bias), _desc(alibi_slopes), _desc(cu_q), _desc(cu_k))
    if block_layout is not None:
        key += (bytes(block_layout.detach().cpu().to(torch.uint8).contiguous().numpy()), tuple(block_layout.shape))
    e = _cache.get(key)  # the hit path without a call to cached() or a closure
    return e if e is not None else cached(key, lambda: _Entry(q, k, v, bias, alibi_slopes, cu_q, cu_k,
                                                              block_layout, opts))


def cached(key, build):
    """The cache's entry under key; on a miss build() makes it, and the oldest entry is
    dropped when the cache is full."""
    e = _cache.get(key)
    if e is None:
        with _cache_lock:
            e = _cache.get(key)
            if e is None:
                e = build()
                while len(_cache) >= CACHE_SIZE:
                    del _cache[next(iter(_cache))]
                _cache[key] = e
    return e


def clear_cache():
    """Drop every cached plan."""
    with _cache_lock:
        _cache.clear()


def cache_size():
    """How many plans are cached."""
    return len(_cache)


def _ptr(t):
    return 0 if t is None else t.data_ptr()


def _with_strides(t, shape, strides):
    """t itself if it has these strides (size-1 dims aside), else a copy that has them."""
    if all(n <= 1 or a == b for n, a, b in zip(shape, t.stride(), strides)):
        return t
    return torch.empty_strided(shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def _workspace(e, nbytes, like):
    """Scratch for one run: from torch's caching allocator on CUDA (on the device of the
    tensor `like`); on the CPU a buffer of the calling thread, reused by its next run (a
    CPU run is synchronous)."""
    if e.cuda:
        return like.new_empty_strided((nbytes,), (1,), dtype=torch.uint8)
    buf = getattr(_host, "workspace", None)
    if buf is None or buf.numel() < nbytes:
        buf = _host.workspace = torch.empty(nbytes, dtype=torch.uint8)
    return buf


def _run(e, fn, name, args, ws_bytes, like, rng):
    """One C run of e on the current torch stream of the device of the tensor `like`."""
    ws = _workspace(e, ws_bytes, like) if ws_bytes else None  # alive until the run is enqueued
    ws_ptr = 0 if ws is None else ws.data_ptr()
    stream = _raw_stream(like.get_device()) if e.cuda else None
    if e.dropout_p:
        seed, offset = (int(x) for x in rng.tolist())
        with e.lock:
            e.plan.set_dropout(e.dropout_p, seed, offset)
            st = fn(e.handle, args, ws_ptr, ws_bytes, stream)
    else:
        st = fn(e.handle, args, ws_ptr, ws_bytes, stream)
    if st:
        L.check(st, name)


def forward(q, k, v, bias, alibi_slopes, cu_q, cu_k, block_layout, rng, opts, want_lse):
    """(out, lse) of one forward run; lse is None unless want_lse."""
    e = entry(q, k, v, bias, alibi_slopes, cu_q, cu_k, block_layout, opts)
    return run_forward(e, q, k, v, bias, alibi_slopes, cu_q, cu_k, rng, want_lse)


def run_forward(e, q, k, v, bias, alibi_slopes, cu_q, cu_k, rng, want_lse):
    """:func:`forward` on e, the entry of these tensors and options."""
    out = torch.empty_like(q) if e.out_like_q else q.new_empty_strided(e.out[0], e.out[1])
    lse = q.new_empty_strided(e.lse[0], e.lse[1], dtype=torch.float32) if want_lse else None
    args = _FWD_ARGS.pack(_FWD_SIZE, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                          0 if lse is None else lse.data_ptr(), 0 if bias is None else bias.data_ptr(),
                          0 if alibi_slopes is None else alibi_slopes.data_ptr(),
                          0 if cu_q is None else cu_q.data_ptr(), 0 if cu_k is None else cu_k.data_ptr())
    _run(e, _cfunc("flashattn_fwd"), "flashattn_fwd", args, e.ws_fwd, q, rng)
    return out, lse


def backward(dout, q, k, v, out, lse, bias, alibi_slopes, cu_q, cu_k, block_layout, rng, opts, want_dbias):
    """(dq, dk, dv, dbias) of one backward run; dbias is None unless want_dbias."""
    e = entry(q, k, v, bias, alibi_slopes, cu_q, cu_k, block_layout, opts)
    return run_backward(e, dout, q, k, v, out, lse, bias, alibi_slopes, cu_q, cu_k, rng, want_dbias)


def run_backward(e, dout, q, k, v, out, lse, bias, alibi_slopes, cu_q, cu_k, rng, want_dbias):
    """:func:`backward` on e, the entry of these tensors and options (the one their forward
    ran on)."""
    o_shape, o_strides = e.out
    if out.stride() != o_strides:
        out = _with_strides(out, o_shape, o_strides)
    if dout.stride() != o_strides:
        dout = _with_strides(dout, o_shape, o_strides)
    if e.grads_like_inputs:
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    else:
        (qs, qst), (ks, kst), (vs, vst) = e.grads
        dq, dk, dv = q.new_empty_strided(qs, qst), q.new_empty_strided(ks, kst), q.new_empty_strided(vs, vst)
    dbias = None
    if want_dbias:
        if e.dbias is None:
            raise make_error(Status.INVALID_ARGUMENT, "want_dbias=True needs a bias tensor")
        dbias = q.new_empty_strided(e.dbias[0], e.dbias[1])
    args = _BWD_ARGS.pack(_BWD_SIZE, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                          lse.contiguous().data_ptr(), dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                          0 if bias is None else bias.data_ptr(), 0 if dbias is None else dbias.data_ptr(),
                          0 if alibi_slopes is None else alibi_slopes.data_ptr(),
                          0 if cu_q is None else cu_q.data_ptr(), 0 if cu_k is None else cu_k.data_ptr())
    _run(e, _cfunc("flashattn_bwd"), "flashattn_bwd", args, e.ws_bwd, q, rng)
    return dq, dk, dv, dbias


def backward_into(dout, q, k, v, out, lse, dq, dk, dv, opts, accumulate):
    """One backward run (4-D tensors, no bias, ALiBi, varlen or block-sparse layout) that
    writes its gradients into dq, dk, dv, or with accumulate=True adds them there
    (flashattn_plan_set_grad_accumulate), without copies: out, dout and the gradients may
    be views of any strides, as q, k and v may; lse must be contiguous."""
    strides = (out.stride(), dout.stride(), dq.stride(), dk.stride(), dv.stride())
    key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
           v.shape, v.stride(), v.dtype, v.device, opts, "into", accumulate, strides)
    e = _cache.get(key)
    if e is None:
        e = cached(key, lambda: _Entry(q, k, v, None, None, None, None, None, opts, into=(accumulate, strides)))
    args = _BWD_ARGS.pack(_BWD_SIZE, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                          dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), 0, 0, 0, 0, 0)
    _run(e, _cfunc("flashattn_bwd"), "flashattn_bwd", args, e.ws_bwd, q, None)
