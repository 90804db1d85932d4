"""The Plan class and the array-level forward/backward entry points."""
from __future__ import annotations

import ctypes
import random
import sys

from . import _arrays as A
from . import _lib as L
from ._lib import Algorithm, Align, Backend, Bias, DType, Pass, Rotary, Status, Tensor, make_error

_TENSOR_NAMES = {
    "q": Tensor.Q, "k": Tensor.K, "v": Tensor.V, "o": Tensor.O, "out": Tensor.O,
    "do": Tensor.DO, "dout": Tensor.DO, "dq": Tensor.DQ, "dk": Tensor.DK, "dv": Tensor.DV,
}
_BACKEND_NAMES = {"auto": Backend.AUTO, "cpu": Backend.CPU, "cuda": Backend.CUDA}
_ALIGN_NAMES = {"top_left": Align.TOP_LEFT, "bottom_right": Align.BOTTOM_RIGHT}
_ALGO_NAMES = {"flash": Algorithm.FLASH, "standard": Algorithm.STANDARD}
_PASS_NAMES = {"forward": Pass.FORWARD, "fwd": Pass.FORWARD, "backward": Pass.BACKWARD, "bwd": Pass.BACKWARD,
               "forward_kvcache": Pass.FORWARD_KVCACHE}
_ROTARY_NAMES = {"none": Rotary.NONE, "half": Rotary.HALF, "interleaved": Rotary.INTERLEAVED}


def _enum(table, enum_type, value, what):
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str) and value.lower() in table:
        return table[value.lower()]
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return enum_type(value)
        except ValueError:
            pass
    raise make_error(Status.INVALID_ENUM, "%s=%r is not one of %s" % (what, value, sorted(set(table))))


def tensor_id(t):
    """A Tensor enum from 'q', 'k', 'v', 'o', 'do', 'dq', 'dk', 'dv' or a Tensor."""
    return _enum(_TENSOR_NAMES, Tensor, t, "tensor")


def _i64x4(strides, what):
    try:
        vals = [int(s) for s in strides]
    except TypeError:
        raise make_error(Status.INVALID_ARGUMENT, "%s=%r is not a sequence of 4 integers" % (what, strides))
    if len(vals) != 4:
        raise make_error(Status.INVALID_ARGUMENT, "%s=%r must have 4 entries (batch, seq, head, dim)" % (what, strides))
    return (ctypes.c_int64 * 4)(*vals)


def _contiguous_bshd(s, h, d):
    return (s * h * d, h * d, d, 1)


def _stream_value(stream):
    """An integer cudaStream_t from None, an int, a torch.cuda.Stream or a CuPy stream."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise make_error(Status.INVALID_ARGUMENT, "stream=%r is not an integer cudaStream_t, a torch.cuda.Stream or a "
                     "CuPy stream" % (stream,))


# ---------------------------------------------------------------- allocation


def _numpy_dtype(kind, like):
    import numpy as np
    if kind == A.F16:
        return np.float16
    if kind == A.F32:
        return np.float32
    if kind == A.I32:
        return np.int32
    if kind == A.BF16:
        # Outputs use the representation of the inputs: a bfloat16 dtype, or uint16 bits.
        if like is not None and like.framework == "numpy" and like.owner.dtype.itemsize == 2:
            return like.owner.dtype
        try:
            import ml_dtypes  # noqa: F401
            return ml_dtypes.bfloat16
        except ImportError:
            return np.uint16  # raw bfloat16 bits
    raise make_error(Status.INTERNAL_ERROR, "no numpy dtype for %s" % kind)


def _torch_dtype(kind):
    import torch
    return {A.F16: torch.float16, A.BF16: torch.bfloat16, A.F32: torch.float32, A.I32: torch.int32,
            A.U8: torch.uint8}[kind]


def _have(mod):
    if mod in sys.modules:
        return True
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


def alloc(like, shape, strides, kind):
    """An uninitialized array of `shape` with element `strides` in the framework and on the
    device of view `like`."""
    shape, strides = tuple(shape), tuple(strides)
    span = A.span_elems(shape, strides)
    if like.framework == "torch":
        import torch
        return torch.empty_strided(shape, strides, dtype=_torch_dtype(kind), device=like.owner.device)
    if not like.is_cuda:
        import numpy as np
        dt = np.dtype(_numpy_dtype(kind, like))
        buf = np.empty(max(span, 1), dtype=dt)
        return np.lib.stride_tricks.as_strided(buf, shape, tuple(s * dt.itemsize for s in strides))
    dev = like.device[1]
    if like.framework == "cupy" or (not _have("torch") and _have("cupy")):
        import cupy
        with cupy.cuda.Device(dev if dev is not None else cupy.cuda.runtime.getDevice()):
            dt = cupy.dtype({A.F16: "float16", A.F32: "float32", A.I32: "int32", A.U8: "uint8",
                             A.BF16: "uint16"}[kind])
            mem = cupy.cuda.alloc(max(span, 1) * dt.itemsize)
            return cupy.ndarray(shape, dt, mem, tuple(s * dt.itemsize for s in strides))
    if _have("torch"):
        import torch
        device = torch.device("cuda", dev) if dev is not None else torch.device("cuda")
        return torch.empty_strided(shape, strides, dtype=_torch_dtype(kind), device=device)
    raise make_error(Status.NOT_SUPPORTED, "cannot allocate a CUDA array: neither torch nor cupy is importable; "
                     "pass the output arrays (and workspace=) yourself")


def alloc_workspace(nbytes, like, plan_device):
    """Scratch of nbytes on the memory of `like` (None when nbytes is 0)."""
    if nbytes == 0:
        return None
    if not like.is_cuda:
        if like.framework == "torch":
            import torch
            return torch.empty(nbytes, dtype=torch.uint8)
        import numpy as np
        return np.empty(nbytes, dtype=np.uint8)
    dev = like.device[1] if like.device[1] is not None else plan_device
    return alloc(A.View("workspace", 0, (nbytes,), (1,), A.U8, ("cuda", dev), False, like.owner,
                        like.framework), (nbytes,), (1,), A.U8)


def _default_stream(views):
    for v in views:
        if v is None or not v.is_cuda:
            continue
        if v.framework == "torch":
            import torch
            return torch.cuda.current_stream(v.owner.device).cuda_stream
        if v.framework == "cupy":
            import cupy
            return cupy.cuda.get_current_stream().ptr
    return 0


def _keep_alive_on_stream(objs, stream):
    """Tell torch's caching allocator that memory it handed us is used on `stream`."""
    if not stream or "torch" not in sys.modules:
        return
    import torch
    ext = None
    for o in objs:
        if isinstance(o, torch.Tensor) and o.is_cuda:
            if o.device.type == "cuda" and torch.cuda.current_stream(o.device).cuda_stream == stream:
                continue
            if ext is None:
                ext = torch.cuda.ExternalStream(stream, device=o.device)
            o.record_stream(ext)


# ---------------------------------------------------------------- Plan


class Plan:
    """An attention problem: shape, dtype and options, bound to a backend and device.

    Construct with the shape; options can be given as keywords (see :meth:`configure`)
    or with the setter methods, each of which returns the plan so calls can be chained::

        plan = flashattn.Plan(2, 128, 128, 8, 2, 64, dtype='fp32', backend='cpu', causal=True)
        out, lse = plan.forward(q, k, v)

    Every setter calls the matching C setter at once; a rejected value raises a
    :class:`FlashAttnError` subclass and leaves the plan unchanged. A plan may be run
    from many threads at once, but setters must not race with runs.
    """

    def __init__(self, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim_qk, head_dim_v=None, *,
                 dtype="fp16", backend="auto", device=0, **options):
        self._handle = None
        backend = _enum(_BACKEND_NAMES, Backend, backend, "backend")
        lib = L.lib()
        h = ctypes.c_void_p()
        L.call("flashattn_plan_create", ctypes.byref(h), int(backend), int(device))
        self._handle = h
        self._lib = lib
        self.device = int(device)
        self._dtype = DType.FP16
        self._varlen = None
        self._bias_kind = Bias.NONE
        self._bias_strides = None
        self._alibi_batch_stride = 0
        self._dropout = (0.0, 0, 0)
        self._grad_accumulate = False
        self._layout = None
        self._kv = None
        try:
            self.set_shape(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim_qk, head_dim_v)
            self.set_dtype(dtype)
            self.configure(**options)
        except BaseException:
            self.close()
            raise

    # ---- lifetime ----
    def close(self):
        """Destroy the C plan now (also done when the object is garbage-collected)."""
        h, self._handle = self._handle, None
        if h is not None and h.value:
            self._lib.flashattn_plan_destroy(h)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def handle(self):
        """The flashattn_plan_t as a ctypes.c_void_p (for calling the C API directly)."""
        if self._handle is None:
            raise make_error(Status.NULL_POINTER, "plan: this Plan has been closed")
        return self._handle

    def _call(self, name, *args):
        L.call(name, self.handle, *args)
        return self

    # ---- queries ----
    @property
    def backend(self):
        """The resolved backend, 'cpu' or 'cuda'."""
        b = ctypes.c_int()
        self._call("flashattn_plan_get_backend", ctypes.byref(b))
        return Backend(b.value).name.lower()

    @property
    def dtype(self):
        """'fp16', 'bf16' or 'fp32'."""
        return A.DTYPE_NAMES[self._dtype]

    @property
    def shape(self):
        """(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim_qk, head_dim_v)."""
        return self._shape

    @property
    def varlen(self):
        """(total_q, total_k) when variable-length mode is on, else None."""
        return self._varlen

    def strides(self, tensor):
        """The element strides (batch, seq, head, dim) set for a tensor ('q', 'k', ..., 'dv')."""
        return self._strides[tensor_id(tensor)]

    def workspace_size(self, pass_="forward"):
        """Workspace bytes a pass ('forward', 'backward' or 'forward_kvcache') needs."""
        p = _enum(_PASS_NAMES, Pass, pass_, "pass")
        n = ctypes.c_size_t()
        self._call("flashattn_plan_get_workspace_size", int(p), ctypes.byref(n))
        return n.value

    # ---- setters (each returns self) ----
    def set_shape(self, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim_qk, head_dim_v=None):
        """Set the shape; resets every tensor's strides to contiguous BSHD."""
        if head_dim_v is None:
            head_dim_v = head_dim_qk
        shape = tuple(int(x) for x in (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim_qk, head_dim_v))
        self._call("flashattn_plan_set_shape", *shape)
        b, sq, sk, hq, hkv, dqk, dv = shape
        self._shape = shape
        self._strides = {
            Tensor.Q: _contiguous_bshd(sq, hq, dqk), Tensor.K: _contiguous_bshd(sk, hkv, dqk),
            Tensor.V: _contiguous_bshd(sk, hkv, dv), Tensor.O: _contiguous_bshd(sq, hq, dv),
            Tensor.DO: _contiguous_bshd(sq, hq, dv), Tensor.DQ: _contiguous_bshd(sq, hq, dqk),
            Tensor.DK: _contiguous_bshd(sk, hkv, dqk), Tensor.DV: _contiguous_bshd(sk, hkv, dv),
        }
        return self

    def set_dtype(self, dtype):
        """Element type of all tensors: 'fp16', 'bf16' or 'fp32' (or a numpy/torch dtype)."""
        d = A.parse_dtype(dtype)
        self._call("flashattn_plan_set_dtype", int(d))
        self._dtype = d
        return self

    def set_strides(self, tensor, strides):
        """Element strides (batch, seq, head, dim) of one tensor; dim must be 1."""
        t = tensor_id(tensor)
        arr = _i64x4(strides, "strides")
        self._call("flashattn_plan_set_strides", int(t), arr)
        self._strides[t] = tuple(arr)
        return self

    def set_scale(self, scale):
        """Softmax scale (None or 0 restores 1/sqrt(head_dim_qk))."""
        return self._call("flashattn_plan_set_softmax_scale", float(scale or 0.0))

    def set_algorithm(self, algorithm):
        """'flash' (default) or 'standard' (materializes S and P; the baseline)."""
        a = _enum(_ALGO_NAMES, Algorithm, algorithm, "algorithm")
        return self._call("flashattn_plan_set_algorithm", int(a))

    def set_varlen(self, total_q=None, total_k=None):
        """Enable packed variable-length sequences with these token totals; no arguments disables."""
        if total_q is None and total_k is None:
            self._call("flashattn_plan_set_varlen", 0, 0, 0)
            self._varlen = None
            return self
        if total_q is None or total_k is None:
            raise make_error(Status.INVALID_SHAPE, "set_varlen: give both total_q and total_k (got %r, %r)"
                             % (total_q, total_k))
        self._call("flashattn_plan_set_varlen", 1, int(total_q), int(total_k))
        self._varlen = (int(total_q), int(total_k))
        return self

    def set_deterministic(self, enabled=True):
        """Bitwise run-to-run reproducible gradients (always true on the CPU)."""
        return self._call("flashattn_plan_set_deterministic", 1 if enabled else 0)

    def set_grad_accumulate(self, enabled=True):
        """The backward adds its gradients to the dq, dk, dv it is given (each element the
        fp32 sum of the old value and the gradient, rounded once) instead of overwriting
        them; backward() then requires all three. dbias cannot be accumulated."""
        self._call("flashattn_plan_set_grad_accumulate", 1 if enabled else 0)
        self._grad_accumulate = bool(enabled)
        return self

    def set_mask(self, causal=False, window=None, align="top_left"):
        """Band mask. causal=True keeps j <= i'; window=(left, right) bounds each side (None or a
        negative value = unbounded; with causal, right must be None or 0). align: 'top_left'
        (i' = i) or 'bottom_right' (i' = i + seqlen_k - seqlen_q), also used by ALiBi."""
        al = _enum(_ALIGN_NAMES, Align, align, "align")
        left, right = (None, None) if window is None else tuple(window)
        if causal:
            if right is not None and right >= 0 and right != 0:
                raise make_error(Status.INCOMPATIBLE_OPTIONS, "causal=True with window right=%d: causal means "
                                 "right=0" % right)
            right = 0
        left = -1 if left is None else int(left)
        right = -1 if right is None else int(right)
        return self._call("flashattn_plan_set_band_mask", int(al), left, right)

    def set_band_mask(self, align, window_left, window_right):
        """The C setter as is: keep (i, j) iff i' - window_left <= j <= i' + window_right."""
        al = _enum(_ALIGN_NAMES, Align, align, "align")
        return self._call("flashattn_plan_set_band_mask", int(al), int(window_left), int(window_right))

    def set_softcap(self, softcap):
        """s = softcap * tanh(s / softcap); 0 or None disables."""
        return self._call("flashattn_plan_set_softcap", float(softcap or 0.0))

    def set_bias(self, kind, strides=None):
        """Bias kind: None/'none', 'tensor' (with strides (batch, head, q, k), 0 = broadcast),
        'alibi' or 'alibi_symmetric'."""
        table = {"none": Bias.NONE, "tensor": Bias.TENSOR, "alibi": Bias.ALIBI,
                 "alibi_symmetric": Bias.ALIBI_SYMMETRIC}
        k = Bias.NONE if kind is None else _enum(table, Bias, kind, "bias")
        arr = None if strides is None else _i64x4(strides, "bias_strides")
        self._call("flashattn_plan_set_bias", int(k), arr)
        self._bias_kind = k
        self._bias_strides = tuple(arr) if arr is not None else None
        self._alibi_batch_stride = 0
        return self

    def set_alibi(self, symmetric=False, batch_stride=0):
        """ALiBi bias slope[b, h] * (j - i') (or -slope[b, h] * |i' - j| when symmetric). Slopes
        are fp32 (heads_q,) with batch_stride 0, else (batch, heads_q) with rows batch_stride
        elements apart."""
        self.set_bias("alibi_symmetric" if symmetric else "alibi")
        return self.set_alibi_batch_stride(batch_stride) if batch_stride else self

    def set_alibi_batch_stride(self, batch_stride):
        """Elements between consecutive sequences' ALiBi slopes (0: one slope per head);
        after set_alibi/set_bias, which reset it to 0."""
        self._call("flashattn_plan_set_alibi_batch_stride", int(batch_stride))
        self._alibi_batch_stride = int(batch_stride)
        return self

    def set_dropout(self, p, seed=0, offset=0):
        """Dropout with drop probability p in [0, 1) and the Philox (seed, offset); p = 0 disables."""
        self._call("flashattn_plan_set_dropout", float(p), int(seed) & (2**64 - 1), int(offset) & (2**64 - 1))
        self._dropout = (float(p), int(seed), int(offset))
        return self

    def set_block_sparse(self, layout, block_q=None, block_k=None):
        """Block-sparse layout: a uint8/bool array [rows, cols] or [layout_heads, rows, cols] with
        rows = ceil(seqlen_q / block_q) and cols = ceil(seqlen_k / block_k); None clears."""
        if layout is None:
            self._call("flashattn_plan_set_block_sparse", None, 0, 0, 0, 0, 0)
            self._layout = None
            return self
        import numpy as np
        lay = np.ascontiguousarray(np.asarray(layout), dtype=np.uint8)
        if lay.ndim == 2:
            lay = lay[None]
        if lay.ndim != 3:
            raise make_error(Status.INVALID_LAYOUT, "block_sparse layout has %d dimensions; need 2 (rows, cols) or "
                             "3 (layout_heads, rows, cols)" % lay.ndim)
        if block_q is None or block_k is None:
            raise make_error(Status.INVALID_LAYOUT, "block_sparse: block_q and block_k are required (got %r, %r)"
                             % (block_q, block_k))
        h, r, c = lay.shape
        self._call("flashattn_plan_set_block_sparse", lay.ctypes.data, h, r, c, int(block_q), int(block_k))
        self._layout = (lay, int(block_q), int(block_k))
        return self

    def set_kvcache(self, num_rows=None, *, page_size=0, max_pages_per_seq=0, k_cache_strides=None,
                    v_cache_strides=None, seqlen_new=0, k_new_strides=None, v_new_strides=None, rotary=None,
                    rotary_dim=0, rotary_rows=0, num_splits=0):
        """KV-cache mode (flashattn_plan_set_kvcache; docs/inference.md): the plan's seqlen_q is
        the new query tokens per sequence, its seqlen_k the capacity of one sequence. num_rows:
        cache rows, or pages in the pool when page_size >= 1 (then max_pages_per_seq is the
        block table's width). Strides (row or page, token, head, dim) in elements, None =
        contiguous. seqlen_new: tokens appended per sequence and run. rotary: None, 'half' or
        'interleaved', with rotary_dim (even) and rotary_rows (positions in the tables).
        num_splits: key splits, 0 = the library chooses. No arguments leaves KV-cache mode."""
        if num_rows is None:
            self._call("flashattn_plan_set_kvcache", None)
            self._kv = None
            return self
        rot = Rotary.NONE if rotary is None else _enum(_ROTARY_NAMES, Rotary, rotary, "rotary")
        given = {}
        for name, st in (("k_cache_strides", k_cache_strides), ("v_cache_strides", v_cache_strides),
                         ("k_new_strides", k_new_strides), ("v_new_strides", v_new_strides)):
            given[name] = None if st is None else _i64x4(st, name)
        cfg = L.KvcacheConfig(page_size=int(page_size), num_rows=int(num_rows),
                              max_pages_per_seq=int(max_pages_per_seq), seqlen_new=int(seqlen_new), rotary=int(rot),
                              rotary_dim=int(rotary_dim), rotary_rows=int(rotary_rows), num_splits=int(num_splits),
                              **given)
        self._call("flashattn_plan_set_kvcache", ctypes.byref(cfg))
        self._kv = dict(page_size=cfg.page_size, num_rows=cfg.num_rows, max_pages=cfg.max_pages_per_seq,
                        seqlen_new=cfg.seqlen_new, rotary=rot, rotary_dim=cfg.rotary_dim, rotary_rows=cfg.rotary_rows,
                        **{name: None if st is None else tuple(st) for name, st in given.items()})
        return self

    def configure(self, *, scale=None, causal=None, window=None, align=None, softcap=None, bias=None,
                  bias_strides=None, alibi=None, dropout_p=None, seed=None, offset=None, block_sparse=None,
                  varlen=None, deterministic=None, algorithm=None, strides=None, grad_accumulate=None):
        """Set several options at once; a None keyword leaves that option as it is.

        scale: float. causal: bool; window: (left, right); align: 'top_left'/'bottom_right'.
        softcap: float. bias: 'tensor' (needs bias_strides), 'alibi', 'alibi_symmetric' or
        'none'; alibi: True/'symmetric' (shorthand). dropout_p, seed, offset. block_sparse:
        (layout, block_q, block_k). varlen: (total_q, total_k) or False. deterministic: bool.
        algorithm: 'flash'/'standard'. strides: {tensor name: (b, s, h, d)}. grad_accumulate: bool.
        """
        if strides:
            for t, s in strides.items():
                self.set_strides(t, s)
        if scale is not None:
            self.set_scale(scale)
        if causal is not None or window is not None or align is not None:
            self.set_mask(bool(causal), window, align or "top_left")
        if softcap is not None:
            self.set_softcap(softcap)
        if alibi:
            if bias not in (None, "none"):
                raise make_error(Status.INCOMPATIBLE_OPTIONS, "alibi=%r with bias=%r: choose one" % (alibi, bias))
            self.set_alibi(symmetric=(alibi == "symmetric"))
        elif bias is not None:
            self.set_bias(bias, bias_strides)
        if dropout_p is not None or seed is not None or offset is not None:
            self.set_dropout(dropout_p if dropout_p is not None else self._dropout[0],
                             seed if seed is not None else self._dropout[1],
                             offset if offset is not None else self._dropout[2])
        if block_sparse is not None:
            self.set_block_sparse(*block_sparse)
        if varlen is not None:
            if varlen is False:
                self.set_varlen()
            else:
                self.set_varlen(*varlen)
        if deterministic is not None:
            self.set_deterministic(deterministic)
        if algorithm is not None:
            self.set_algorithm(algorithm)
        if grad_accumulate is not None:
            self.set_grad_accumulate(grad_accumulate)
        return self

    # ---- argument checks ----
    def _qkv_shapes(self):
        b, sq, sk, hq, hkv, dqk, dv = self._shape
        if self._varlen:
            tq, tk = self._varlen
            return {Tensor.Q: (tq, hq, dqk), Tensor.K: (tk, hkv, dqk), Tensor.V: (tk, hkv, dv),
                    Tensor.O: (tq, hq, dv)}
        return {Tensor.Q: (b, sq, hq, dqk), Tensor.K: (b, sk, hkv, dqk), Tensor.V: (b, sk, hkv, dv),
                Tensor.O: (b, sq, hq, dv)}

    def expected_shape(self, tensor):
        """The array shape a tensor must have: 4-D (batch, seq, heads, dim), or 3-D (tokens,
        heads, dim) in variable-length mode."""
        t = tensor_id(tensor)
        base = {Tensor.DO: Tensor.O, Tensor.DQ: Tensor.Q, Tensor.DK: Tensor.K, Tensor.DV: Tensor.V}.get(t, t)
        return self._qkv_shapes()[base]

    def lse_shape(self):
        b, sq, _, hq = self._shape[:4]
        return (hq, self._varlen[0]) if self._varlen else (b, hq, sq)

    def _want_kind(self):
        return A.DTYPE_NAMES[self._dtype]

    def _check_device(self, v, backend):
        if backend == "cpu":
            if v.is_cuda:
                raise make_error(Status.WRONG_MEMORY_SPACE, "%s is CUDA device memory but the plan runs on the CPU "
                                 "backend" % v.name)
        else:
            if not v.is_cuda:
                raise make_error(Status.WRONG_MEMORY_SPACE, "%s is host memory but the plan runs on CUDA device %d"
                                 % (v.name, self.device))
            if v.device[1] is not None and v.device[1] != self.device:
                raise make_error(Status.WRONG_MEMORY_SPACE, "%s is on CUDA device %d but the plan runs on device %d"
                                 % (v.name, v.device[1], self.device))

    def _check_array(self, v, want, strides, kind, backend, output=False, dims="", stride_hint=""):
        """v has shape `want` (dims: how they are named), element kind `kind`, the element
        `strides` along every dim of size > 1, and lives where the plan runs."""
        if v.shape != want:
            raise make_error(Status.INVALID_SHAPE, "%s has shape %s; the plan needs %s%s"
                             % (v.name, v.shape, want, dims))
        if v.kind != kind:
            raise make_error(Status.INVALID_ARGUMENT, "%s has element type %s; the plan needs %s"
                             % (v.name, v.kind, kind))
        self._check_device(v, backend)
        if output and v.readonly:
            raise make_error(Status.INVALID_ARGUMENT, "%s is read-only" % v.name)
        for n, got, exp in zip(v.shape, v.strides, strides):
            if n > 1 and got != exp:
                raise make_error(Status.INVALID_STRIDE, "%s has element strides %s; the plan's are %s%s"
                                 % (v.name, v.strides, tuple(strides), stride_hint))

    def _check_tensor(self, v, tensor, backend, output=False):
        t = tensor_id(tensor)
        ps = self._strides[t]
        hint = " (set them with plan.set_strides(%r, ...) or pass arrays with that layout)" % t.name.lower()
        self._check_array(v, self.expected_shape(t), ps[1:] if self._varlen else ps, self._want_kind(), backend,
                          output, " (tokens, heads, dim)" if self._varlen else " (batch, seq, heads, dim)", hint)

    def _check_lse(self, v, backend, output):
        want = self.lse_shape()
        if v.shape != want or v.kind != A.F32:
            raise make_error(Status.INVALID_SHAPE, "%s must be float32 of shape %s (got %s %s)"
                             % (v.name, want, v.kind, v.shape))
        if any(n > 1 and s != e for n, s, e in zip(v.shape, v.strides, A._c_strides(want))):
            raise make_error(Status.INVALID_STRIDE, "%s must be C-contiguous (strides %s)" % (v.name, v.strides))
        self._check_device(v, backend)
        if output and v.readonly:
            raise make_error(Status.INVALID_ARGUMENT, "%s is read-only" % v.name)

    def _check_vector(self, v, kind, n, backend, what):
        if v.kind != kind or v.shape != (n,):
            raise make_error(Status.INVALID_SHAPE, "%s must be %s of shape (%d,) (got %s %s)"
                             % (v.name, kind, n, v.kind, v.shape))
        if n > 1 and v.strides != (1,):
            raise make_error(Status.INVALID_STRIDE, "%s must be contiguous (stride %s)" % (v.name, v.strides))
        self._check_device(v, backend)

    def _check_slopes_per_batch(self, v, b, hq, backend):
        st = self._alibi_batch_stride
        if v.kind != A.F32 or v.shape != (b, hq):
            raise make_error(Status.INVALID_SHAPE, "%s must be %s of shape (%d, %d) with the plan's ALiBi batch stride "
                             "%d (got %s %s)" % (v.name, A.F32, b, hq, st, v.kind, v.shape))
        if (b > 1 and v.strides[0] != st) or (hq > 1 and v.strides[1] != 1):
            raise make_error(Status.INVALID_STRIDE, "%s has element strides %s; the plan wants (%d, 1)"
                             % (v.name, v.strides, st))
        self._check_device(v, backend)

    def bias_shape(self):
        b, sq, sk, hq = self._shape[0], self._shape[1], self._shape[2], self._shape[3]
        return (b, hq, sq, sk)

    def _check_bias(self, v, backend, output=False):
        full = self.bias_shape()
        st = self._bias_strides
        want = tuple(1 if s == 0 else n for n, s in zip(full, st))
        if len(v.shape) != 4 or any(n not in (w, f) for n, w, f in zip(v.shape, want, full)):
            raise make_error(Status.INVALID_SHAPE, "%s has shape %s; with the plan's bias strides %s it must be %s "
                             "(size 1 or the full size along zero-stride dims)" % (v.name, v.shape, st, want))
        for n, got, exp in zip(v.shape, v.strides, st):
            if n > 1 and got != exp:
                raise make_error(Status.INVALID_STRIDE, "%s has element strides %s; the plan's bias strides are %s"
                                 % (v.name, v.strides, st))
        if v.kind != self._want_kind():
            raise make_error(Status.INVALID_ARGUMENT, "%s has element type %s; the plan's dtype is %s"
                             % (v.name, v.kind, self._want_kind()))
        self._check_device(v, backend)
        if output and v.readonly:
            raise make_error(Status.INVALID_ARGUMENT, "%s is read-only" % v.name)

    def _common_inputs(self, backend, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, stream):
        out = {}
        b, hq = self._shape[0], self._shape[3]
        if self._bias_kind == Bias.TENSOR:
            if bias is None:
                raise make_error(Status.NULL_POINTER, "bias: the plan's bias kind is 'tensor' but no bias was given")
            out["bias"] = A.view("bias", bias, self._want_kind(), stream)
            self._check_bias(out["bias"], backend)
        elif bias is not None:
            raise make_error(Status.INVALID_ARGUMENT, "bias was given but the plan's bias kind is %s; call "
                             "plan.set_bias('tensor', strides) first" % self._bias_kind.name.lower())
        if self._bias_kind in (Bias.ALIBI, Bias.ALIBI_SYMMETRIC):
            if alibi_slopes is None:
                raise make_error(Status.NULL_POINTER, "alibi_slopes: the plan uses ALiBi but no slopes were given")
            out["alibi_slopes"] = A.view("alibi_slopes", alibi_slopes, None, stream)
            if self._alibi_batch_stride == 0 and len(out["alibi_slopes"].shape) == 1:
                self._check_vector(out["alibi_slopes"], A.F32, hq, backend, "alibi_slopes")
            else:  # (batch, heads_q); with batch stride 0 its rows are one (size 1 or broadcast)
                self._check_slopes_per_batch(out["alibi_slopes"], b, hq, backend)
        elif alibi_slopes is not None:
            raise make_error(Status.INVALID_ARGUMENT, "alibi_slopes was given but the plan's bias kind is %s; call "
                             "plan.set_alibi() first" % self._bias_kind.name.lower())
        for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            if self._varlen:
                if cu is None:
                    raise make_error(Status.NULL_POINTER, "%s is required in variable-length mode" % name)
                out[name] = A.view(name, cu, None, stream)
                self._check_vector(out[name], A.I32, b + 1, backend, name)
            elif cu is not None:
                raise make_error(Status.INVALID_ARGUMENT, "%s was given but the plan is not in variable-length mode "
                                 "(plan.set_varlen(total_q, total_k))" % name)
        return out

    def _run_prep(self, views, stream):
        backend = self.backend
        s = _stream_value(stream)
        if backend == "cpu":
            if s:
                raise make_error(Status.INVALID_ARGUMENT, "stream=%#x: the CPU backend runs synchronously and takes "
                                 "no stream" % s)
        elif stream is None:
            s = _default_stream(views)
        return backend, s

    def _forward_outputs(self, qv, out, lse, want_lse, backend, sv):
        """(out, its view, lse, its view or None) of a forward run: given arrays checked,
        missing ones allocated like q (lse only when want_lse)."""
        kind = self._want_kind()
        if out is None:
            st = self._strides[Tensor.O]
            out = alloc(qv, self.expected_shape(Tensor.O), st[1:] if self._varlen else st, kind)
        ov = A.view("out", out, kind, sv)
        self._check_tensor(ov, Tensor.O, backend, output=True)
        lv = None
        if lse is None and want_lse:
            lse = alloc(qv, self.lse_shape(), A._c_strides(self.lse_shape()), A.F32)
        if lse is not None:
            lv = A.view("lse", lse, None, sv)
            self._check_lse(lv, backend, output=True)
        return out, ov, lse, lv

    # ---- passes ----
    def forward(self, q, k, v, out=None, lse=None, bias=None, alibi_slopes=None, cu_seqlens_q=None,
                cu_seqlens_k=None, stream=None, workspace=None, want_lse=True):
        """Run the forward pass; returns (out, lse) (lse is None when want_lse=False and
        no lse array was given). Missing outputs are allocated like q (numpy, torch or
        CuPy) with the plan's strides. On CUDA the call is asynchronous on `stream`
        (default: the current torch/CuPy stream of the inputs, else the default stream)."""
        sv = None if stream is None else _stream_value(stream)
        kind = self._want_kind()
        qv = A.view("q", q, kind, sv)
        kv = A.view("k", k, kind, sv)
        vv = A.view("v", v, kind, sv)
        backend, s = self._run_prep([qv, kv, vv], stream)
        self._check_tensor(qv, Tensor.Q, backend)
        self._check_tensor(kv, Tensor.K, backend)
        self._check_tensor(vv, Tensor.V, backend)
        extra = self._common_inputs(backend, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, sv)
        out, ov, lse, lv = self._forward_outputs(qv, out, lse, want_lse, backend, sv)
        need = self.workspace_size(Pass.FORWARD)
        ws, wptr, wbytes = self._workspace(workspace, need, qv, backend)
        args = L.FwdArgs(q=qv.ptr, k=kv.ptr, v=vv.ptr, o=ov.ptr, lse=lv.ptr if lv else None,
                         bias=extra["bias"].ptr if "bias" in extra else None,
                         alibi_slopes=extra["alibi_slopes"].ptr if "alibi_slopes" in extra else None,
                         cu_seqlens_q=extra["cu_seqlens_q"].ptr if "cu_seqlens_q" in extra else None,
                         cu_seqlens_k=extra["cu_seqlens_k"].ptr if "cu_seqlens_k" in extra else None)
        L.check(self._lib.flashattn_fwd(self.handle, ctypes.byref(args), wptr, wbytes, s or None), "flashattn_fwd")
        if backend == "cuda":
            _keep_alive_on_stream([out, lse, ws], s)
        return out, lse

    def backward(self, q, k, v, out, lse, dout, dq=None, dk=None, dv=None, bias=None, dbias=None,
                 alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, stream=None, workspace=None):
        """Run the backward pass; returns (dq, dk, dv), or (dq, dk, dv, dbias) when dbias is
        True or an array (bias kind 'tensor' only). Missing gradients are allocated like q
        with the plan's DQ/DK/DV strides (with set_grad_accumulate all three must be given:
        the run adds to them); an allocated dbias has the bias's shape with size 1 along
        broadcast (zero-stride) dimensions, which hold the summed gradient."""
        sv = None if stream is None else _stream_value(stream)
        kind = self._want_kind()
        views = {}
        for name, x, t in (("q", q, Tensor.Q), ("k", k, Tensor.K), ("v", v, Tensor.V), ("out", out, Tensor.O),
                           ("dout", dout, Tensor.DO)):
            if x is None:
                raise make_error(Status.NULL_POINTER, "%s is required by the backward pass" % name)
            views[name] = A.view(name, x, kind, sv)
        backend, s = self._run_prep(list(views.values()), stream)
        for name, t in (("q", Tensor.Q), ("k", Tensor.K), ("v", Tensor.V), ("out", Tensor.O), ("dout", Tensor.DO)):
            self._check_tensor(views[name], t, backend)
        if lse is None:
            raise make_error(Status.NULL_POINTER, "lse (from the forward pass) is required by the backward pass")
        lv = A.view("lse", lse, None, sv)
        self._check_lse(lv, backend, output=False)
        extra = self._common_inputs(backend, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, sv)
        qv = views["q"]
        grads = []
        for name, arr, t in (("dq", dq, Tensor.DQ), ("dk", dk, Tensor.DK), ("dv", dv, Tensor.DV)):
            if arr is None:
                if self._grad_accumulate:
                    raise make_error(Status.NULL_POINTER, "%s is required: the plan accumulates gradients "
                                     "(set_grad_accumulate) into the dq, dk and dv it is given" % name)
                st = self._strides[t]
                arr = alloc(qv, self.expected_shape(t), st[1:] if self._varlen else st, kind)
            gv = A.view(name, arr, kind, sv)
            self._check_tensor(gv, t, backend, output=True)
            grads.append((arr, gv))
        dbv = None
        want_dbias = dbias is not None and dbias is not False
        if want_dbias:
            if self._bias_kind != Bias.TENSOR:
                raise make_error(Status.INVALID_ARGUMENT, "dbias was requested but the plan's bias kind is %s"
                                 % self._bias_kind.name.lower())
            if dbias is True:
                st = self._bias_strides
                shape = tuple(1 if s_ == 0 else n for n, s_ in zip(self.bias_shape(), st))
                dbias = alloc(qv, shape, st, kind)
            dbv = A.view("dbias", dbias, kind, sv)
            self._check_bias(dbv, backend, output=True)
        need = self.workspace_size(Pass.BACKWARD)
        ws, wptr, wbytes = self._workspace(workspace, need, qv, backend)
        args = L.BwdArgs(q=qv.ptr, k=views["k"].ptr, v=views["v"].ptr, o=views["out"].ptr, lse=lv.ptr,
                         dout=views["dout"].ptr, dq=grads[0][1].ptr, dk=grads[1][1].ptr, dv=grads[2][1].ptr,
                         bias=extra["bias"].ptr if "bias" in extra else None,
                         dbias=dbv.ptr if dbv is not None else None,
                         alibi_slopes=extra["alibi_slopes"].ptr if "alibi_slopes" in extra else None,
                         cu_seqlens_q=extra["cu_seqlens_q"].ptr if "cu_seqlens_q" in extra else None,
                         cu_seqlens_k=extra["cu_seqlens_k"].ptr if "cu_seqlens_k" in extra else None)
        L.check(self._lib.flashattn_bwd(self.handle, ctypes.byref(args), wptr, wbytes, s or None), "flashattn_bwd")
        res = tuple(g[0] for g in grads)
        if backend == "cuda":
            _keep_alive_on_stream(list(res) + [dbias, ws], s)
        return res + (dbias,) if want_dbias else res

    def kvcache_layouts(self):
        """{argument: (shape, element strides)} of every array a KV-cache run may take, for
        the plan's shape and KV-cache configuration (contiguous where no strides were set)."""
        if self._kv is None:
            raise make_error(Status.PLAN_INCOMPLETE, "the plan has no KV-cache configuration: call "
                             "plan.set_kvcache(...) first")
        kv = self._kv
        b, sq, sk, hq, hkv, dqk, dv = self._shape
        tokens = kv["page_size"] if kv["page_size"] else sk
        half = kv["rotary_dim"] // 2
        shapes = {"k_cache": ((kv["num_rows"], tokens, hkv, dqk), kv["k_cache_strides"]),
                  "v_cache": ((kv["num_rows"], tokens, hkv, dv), kv["v_cache_strides"]),
                  "k_new": ((b, kv["seqlen_new"], hkv, dqk), kv["k_new_strides"]),
                  "v_new": ((b, kv["seqlen_new"], hkv, dv), kv["v_new_strides"]),
                  "rotary_cos": ((kv["rotary_rows"], half), None), "rotary_sin": ((kv["rotary_rows"], half), None),
                  "cache_seqlens": ((b,), None), "cache_batch_idx": ((b,), None),
                  "block_table": ((b, kv["max_pages"]), None)}
        return {name: (shp, st if st is not None else A._c_strides(shp)) for name, (shp, st) in shapes.items()}

    def _kvcache_views(self, backend, arrays, stream):
        """Checked views of the KV-cache run's inputs (a dict name -> array or None). An
        array the configuration does not use is passed on unchecked: the C call refuses it
        (INCOMPATIBLE_OPTIONS) before touching memory."""
        kv = self._kv
        lay = self.kvcache_layouts()
        used = {"k_cache": True, "v_cache": True, "cache_seqlens": True, "k_new": kv["seqlen_new"] > 0,
                "v_new": kv["seqlen_new"] > 0, "rotary_cos": kv["rotary"] != Rotary.NONE,
                "rotary_sin": kv["rotary"] != Rotary.NONE, "cache_batch_idx": not kv["page_size"],
                "block_table": kv["page_size"] > 0}
        dims = {"k_cache": " (row or page, token, head, dim)", "v_cache": " (row or page, token, head, dim)",
                "k_new": " (batch, seqlen_new, heads_kv, dim)", "v_new": " (batch, seqlen_new, heads_kv, dim)",
                "rotary_cos": " (rotary_rows, rotary_dim / 2)", "rotary_sin": " (rotary_rows, rotary_dim / 2)",
                "cache_seqlens": " (batch,)", "cache_batch_idx": " (batch,)",
                "block_table": " (batch, max_pages_per_seq)"}
        views = {}
        for name, x in arrays.items():
            if x is None:
                if name in ("k_cache", "v_cache", "cache_seqlens"):
                    raise make_error(Status.NULL_POINTER, "%s is required by a KV-cache run" % name)
                continue
            kind = A.I32 if name in ("cache_seqlens", "cache_batch_idx", "block_table") else self._want_kind()
            v = views[name] = A.view(name, x, kind, stream)
            if used[name]:
                shp, st = lay[name]
                written = name in ("k_cache", "v_cache") and kv["seqlen_new"] > 0
                self._check_array(v, shp, st, kind, backend, written, dims[name])
        return views

    def forward_kvcache(self, q, k_cache, v_cache, cache_seqlens, out=None, lse=None, cache_batch_idx=None,
                        block_table=None, k_new=None, v_new=None, rotary_cos=None, rotary_sin=None,
                        alibi_slopes=None, stream=None, workspace=None, want_lse=True):
        """One KV-cache run (flashattn_fwd_kvcache): append k_new/v_new (rotated) into the
        caches at each sequence's cache_seqlens, rotate q, attend to the first
        cache_seqlens[b] + seqlen_new keys. Returns (out, lse) as :meth:`forward` does; the
        caches are written in place when appending. Arrays live where the plan runs; the
        layouts are those of :meth:`kvcache_layouts`."""
        sv = None if stream is None else _stream_value(stream)
        kind = self._want_kind()
        qv = A.view("q", q, kind, sv)
        views = self._kvcache_views(
            self.backend, dict(k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                               cache_batch_idx=cache_batch_idx, block_table=block_table, k_new=k_new, v_new=v_new,
                               rotary_cos=rotary_cos, rotary_sin=rotary_sin), sv)
        backend, s = self._run_prep([qv] + list(views.values()), stream)
        self._check_tensor(qv, Tensor.Q, backend)
        extra = self._common_inputs(backend, None, alibi_slopes, None, None, sv)
        out, ov, lse, lv = self._forward_outputs(qv, out, lse, want_lse, backend, sv)
        need = self.workspace_size(Pass.FORWARD_KVCACHE)
        ws, wptr, wbytes = self._workspace(workspace, need, qv, backend)
        ptrs = {name: v.ptr for name, v in views.items()}
        args = L.KvcacheArgs(q=qv.ptr, o=ov.ptr, lse=lv.ptr if lv else None,
                             alibi_slopes=extra["alibi_slopes"].ptr if "alibi_slopes" in extra else None, **ptrs)
        L.check(self._lib.flashattn_fwd_kvcache(self.handle, ctypes.byref(args), wptr, wbytes, s or None),
                "flashattn_fwd_kvcache")
        if backend == "cuda":
            _keep_alive_on_stream([out, lse, ws], s)
        return out, lse

    def _workspace(self, workspace, need, like, backend):
        if workspace is None:
            ws = alloc_workspace(need, like, self.device)
        else:
            ws = workspace
        if ws is None:
            return None, None, 0
        wv = A.view("workspace", ws, None, None)
        self._check_device(wv, backend)
        nbytes = A.span_elems(wv.shape, wv.strides) * max(wv.itemsize, 1)
        if nbytes < need:
            raise make_error(Status.WORKSPACE_TOO_SMALL, "workspace has %d bytes; this pass needs %d" % (nbytes, need))
        return ws, wv.ptr, nbytes

    def __repr__(self):
        if self._handle is None:
            return "<flashattn.Plan (closed)>"
        return "<flashattn.Plan shape=%s dtype=%s backend=%s%s>" % (
            self._shape, self.dtype, self.backend, " varlen=%s" % (self._varlen,) if self._varlen else "")


# ---------------------------------------------------------------- convenience


def _layout_perm(layout, ndim):
    """Axis order of the array dims as (batch, seq, head, dim) indices."""
    layout = (layout or "bshd").lower()
    if ndim == 3:
        if layout not in ("bshd", "thd", "shd"):
            raise make_error(Status.INVALID_ARGUMENT, "layout=%r: packed variable-length arrays are (tokens, heads, "
                             "dim)" % layout)
        return None
    if layout == "bshd":
        return (0, 1, 2, 3)
    if layout == "bhsd":
        return (0, 2, 1, 3)
    raise make_error(Status.INVALID_ARGUMENT, "layout=%r is not 'bshd' or 'bhsd'" % layout)


def _bshd(v, layout):
    """(shape, strides) of a view in (batch, seq, head, dim) order."""
    if len(v.shape) not in (3, 4):
        raise make_error(Status.INVALID_SHAPE, "%s has %d dimensions; need 4 (%s) or 3 (tokens, heads, dim) with "
                         "cu_seqlens" % (v.name, len(v.shape), layout or "bshd"))
    perm = _layout_perm(layout, len(v.shape))
    if perm is None:
        return (0,) + v.shape, (0,) + v.strides
    return tuple(v.shape[i] for i in perm), tuple(v.strides[i] for i in perm)


def _norm_strides(shape, strides):
    """Strides where size-1 dims (never stepped through) get the value a dense array would."""
    # Mirrored in csrc/torch_op.cpp (norm_strides); test_torch_ext.py checks the two agree bitwise.
    out, acc = list(strides), 1
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] <= 1:
            out[i] = acc if i < len(shape) - 1 else 1
        acc = max(acc, abs(out[i]) * max(shape[i], 1))
    return tuple(out)


def _host_max_len(cu, name):
    """Max sequence length from host or torch offsets (None if unknown)."""
    if cu is None:
        return None
    np = sys.modules.get("numpy")
    if np is not None and isinstance(cu, np.ndarray):
        d = np.diff(cu.astype(np.int64))
        return int(d.max()) if d.size else 0
    if _arrays_is_torch(cu):
        return int((cu[1:] - cu[:-1]).max().item()) if cu.numel() > 1 else 0
    raise make_error(Status.INVALID_ARGUMENT, "%s: pass max_seqlen_%s for offsets that are not numpy or torch arrays"
                     % (name, name[-1]))


def _arrays_is_torch(x):
    return A._is_torch(x)


def bias_strides_from(v, full_shape):
    """Plan bias strides of a bias array broadcastable to full_shape (batch, heads_q, sq, sk)."""
    # Mirrored in csrc/torch_op.cpp (bias_strides, bias_servable) for 4-D torch biases.
    shape = v.shape
    if len(shape) > 4:
        raise make_error(Status.INVALID_SHAPE, "bias has %d dimensions; at most 4 (batch, heads, q, k)" % len(shape))
    pad = 4 - len(shape)
    shape = (1,) * pad + shape
    strides = (0,) * pad + v.strides
    out = []
    for i, (n, s, f) in enumerate(zip(shape, strides, full_shape)):
        if n == f and n > 1:
            out.append(s)
        elif n == 1:
            out.append(0)
        else:
            raise make_error(Status.INVALID_SHAPE, "bias shape %s does not broadcast to (batch, heads_q, seqlen_q, "
                             "seqlen_k) = %s" % (v.shape, full_shape))
    if full_shape[3] > 1 and out[3] not in (0, 1):
        raise make_error(Status.INVALID_STRIDE, "bias: the key-dimension stride is %d; it must be 0 or 1 (make the "
                         "last dimension contiguous)" % out[3])
    return tuple(out), shape


def make_plan(q, k, v, *, causal=False, window=None, align="top_left", scale=None, softcap=None, bias=None,
              alibi_slopes=None, alibi_symmetric=False, dropout_p=0.0, seed=None, offset=0, block_sparse=None,
              cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, layout="bshd",
              deterministic=None, algorithm=None, dtype=None, backend=None, device=None, out_strides=None):
    """Build the Plan that `forward(q, k, v, ...)` runs: shapes, dtype and strides from the arrays.

    Returns (plan, info) where info holds the array views and derived values."""
    # Its setter calls (and _torch_plans._Entry's) are mirrored, in the same order, in
    # csrc/torch_op.cpp (build_plan); test_torch_ext.py checks the two paths agree bitwise.
    want = A.parse_dtype(dtype) if dtype is not None else None
    wk = A.DTYPE_NAMES[want] if want is not None else None
    qv, kv, vv = A.view("q", q, wk), A.view("k", k, wk), A.view("v", v, wk)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise make_error(Status.NULL_POINTER, "variable-length mode needs both cu_seqlens_q and cu_seqlens_k")
    for x in (qv, kv, vv):
        if varlen and len(x.shape) != 3:
            raise make_error(Status.INVALID_SHAPE, "%s has shape %s; with cu_seqlens it must be (tokens, heads, dim)"
                             % (x.name, x.shape))
        if not varlen and len(x.shape) != 4:
            raise make_error(Status.INVALID_SHAPE, "%s has shape %s; it must be 4-D (%s)"
                             % (x.name, x.shape, layout))
    (qb, qs, qh, qd), qst = _bshd(qv, layout)
    (kb, ks, kh, kd), kst = _bshd(kv, layout)
    (vb, vs, vh, vd), vst = _bshd(vv, layout)
    if qv.kind not in (A.F16, A.BF16, A.F32):
        raise make_error(Status.DTYPE_NOT_SUPPORTED, "q has element type %s; use float16, bfloat16 or float32 (or "
                         "uint16 bits with dtype='bf16')" % qv.kind)
    for x in (kv, vv):
        if x.kind != qv.kind:
            raise make_error(Status.INVALID_ARGUMENT, "%s has element type %s but q has %s" % (x.name, x.kind, qv.kind))
        if x.device != qv.device:
            raise make_error(Status.WRONG_MEMORY_SPACE, "%s is on %s but q is on %s" % (x.name, x.device, qv.device))
    if kd != qd:
        raise make_error(Status.INVALID_SHAPE, "k head dim %d differs from q head dim %d" % (kd, qd))
    if (ks, kh) != (vs, vh) or (not varlen and kb != vb):
        raise make_error(Status.INVALID_SHAPE, "k %s and v %s disagree on batch, seq or heads" % (kv.shape, vv.shape))
    if not varlen and kb != qb:
        raise make_error(Status.INVALID_SHAPE, "q batch %d differs from k batch %d" % (qb, kb))
    if varlen:
        cuq = A.view("cu_seqlens_q", cu_seqlens_q)
        batch = cuq.shape[0] - 1 if len(cuq.shape) == 1 else -1
        if batch < 1:
            raise make_error(Status.INVALID_SHAPE, "cu_seqlens_q has shape %s; need (batch + 1,) with batch >= 1"
                             % (cuq.shape,))
        sq = max_seqlen_q if max_seqlen_q is not None else _host_max_len(cu_seqlens_q, "cu_seqlens_q")
        sk = max_seqlen_k if max_seqlen_k is not None else _host_max_len(cu_seqlens_k, "cu_seqlens_k")
        sq, sk = max(int(sq), 1), max(int(sk), 1)
        total_q, total_k = qs, ks
    else:
        batch, sq, sk = qb, qs, ks
    if dtype is None:
        dt = {A.F16: DType.FP16, A.BF16: DType.BF16, A.F32: DType.FP32}[qv.kind]
    else:
        dt = want
    if backend is None:
        backend = "cuda" if qv.is_cuda else "cpu"
    if device is None:
        device = qv.device[1] if qv.is_cuda and qv.device[1] is not None else 0
    plan = Plan(batch, sq, sk, qh, kh, qd, vd, dtype=dt, backend=backend, device=device)
    try:
        if varlen:
            plan.set_varlen(total_q, total_k)
        for t, shp, st in ((Tensor.Q, (qb, qs, qh, qd), qst), (Tensor.K, (kb, ks, kh, kd), kst),
                           (Tensor.V, (vb, vs, vh, vd), vst)):
            st = _norm_strides(shp, st)
            if varlen:
                st = (0,) + st[1:]
            plan.set_strides(t, st)
        # Outputs are allocated in the layout of q (dense, same dim order).
        o_shape_bshd = (qb, qs, qh, vd)
        o_st = out_strides or _dense_like(o_shape_bshd, qst)
        plan.set_strides(Tensor.O, o_st)
        plan.set_strides(Tensor.DO, o_st)
        plan.set_strides(Tensor.DQ, _dense_like((qb, qs, qh, qd), qst))
        plan.set_strides(Tensor.DK, _dense_like((kb, ks, kh, kd), kst))
        plan.set_strides(Tensor.DV, _dense_like((vb, vs, vh, vd), vst))
        plan.set_mask(causal, window, align)
        if scale is not None:
            plan.set_scale(scale)
        if softcap:
            plan.set_softcap(softcap)
        bias_view = None
        if bias is not None and alibi_slopes is not None:
            raise make_error(Status.INCOMPATIBLE_OPTIONS, "bias and alibi_slopes cannot be combined")
        if bias is not None:
            bias_view = A.view("bias", bias, qv.kind)
            bst, _ = bias_strides_from(bias_view, (batch, qh, sq, sk))
            plan.set_bias("tensor", bst)
        elif alibi_slopes is not None:
            plan.set_alibi(symmetric=alibi_symmetric, batch_stride=_alibi_batch_stride(alibi_slopes, batch, qh))
        if dropout_p:
            if seed is None:
                seed = random.getrandbits(64)
            plan.set_dropout(dropout_p, seed, offset or 0)
        if block_sparse is not None:
            plan.set_block_sparse(*block_sparse)
        if deterministic is not None:
            plan.set_deterministic(deterministic)
        if algorithm is not None:
            plan.set_algorithm(algorithm)
    except BaseException:
        plan.close()
        raise
    return plan, {"q": qv, "layout": layout, "bias_view": bias_view, "varlen": varlen, "seed": seed}


def _alibi_batch_stride(alibi_slopes, batch, heads):
    """The plan's ALiBi batch stride for slopes of shape (heads,) or (batch, heads), FlashAttention's
    two forms: 0 for the first (and for rows that cannot differ), else the row stride in elements."""
    # Mirrored in csrc/torch_op.cpp (alibi_batch_stride, slopes_fit).
    sv = A.view("alibi_slopes", alibi_slopes)
    if len(sv.shape) == 1:
        return 0
    if len(sv.shape) != 2 or sv.shape != (batch, heads):
        raise make_error(Status.INVALID_SHAPE, "alibi_slopes has shape %s; it must be (heads,) = (%d,) or (batch, "
                         "heads) = (%d, %d)" % (sv.shape, heads, batch, heads))
    return sv.strides[0] if batch > 1 else 0


def _dense_like(shape_bshd, strides_bshd):
    """Dense strides for shape_bshd, with the dimension order of strides_bshd (dim innermost)."""
    # Mirrored in csrc/torch_op.cpp (dense_like); test_torch_ext.py checks the two agree bitwise.
    # Outermost first among b, s, h; extent-1 dims (e.g. the ignored batch of varlen) outermost.
    order = sorted(range(3), key=lambda i: -strides_bshd[i] if shape_bshd[i] > 1 else -float("inf"))
    st = [0, 0, 0, 1]
    acc = shape_bshd[3]
    for i in reversed(order):
        st[i] = acc
        acc *= max(shape_bshd[i], 1)
    return tuple(st)


def _bias4(bias):
    """A 4-D view of a bias array (size-1 dims prepended)."""
    nd = len(bias.shape)
    if nd == 4:
        return bias
    if hasattr(bias, "reshape"):
        return bias.reshape((1,) * (4 - nd) + tuple(bias.shape))
    raise make_error(Status.INVALID_SHAPE, "bias must be 4-D (batch, heads, q, k)")


def _out_array(like_view, plan, t, layout):
    """Allocate an output for tensor t in the array layout of q."""
    st = plan.strides(t)
    shp = plan.expected_shape(t)
    if plan.varlen:
        return alloc(like_view, shp, st[1:], like_view.kind)
    perm = _layout_perm(layout, 4)
    arr_shape = tuple(shp[i] for i in perm)
    arr_st = tuple(st[i] for i in perm)
    return alloc(like_view, arr_shape, arr_st, like_view.kind)


def _bshd_view(x, name, layout, kind):
    """A View of x whose shape/strides are presented in (batch, seq, head, dim) order."""
    v = A.view(name, x, kind)
    if len(v.shape) == 4:
        perm = _layout_perm(layout, 4)
        v = A.View(v.name, v.ptr, tuple(v.shape[i] for i in perm), tuple(v.strides[i] for i in perm), v.kind,
                   v.device, v.readonly, v.owner, v.framework, v.keep)
    return v


def forward(q, k, v, *, causal=False, window=None, align="top_left", scale=None, softcap=None, bias=None,
            alibi_slopes=None, alibi_symmetric=False, dropout_p=0.0, seed=None, offset=0, block_sparse=None,
            cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, layout="bshd",
            deterministic=None, algorithm=None, dtype=None, backend=None, device=None, out=None, lse=None,
            return_lse=False, stream=None):
    """Attention forward on arrays: builds a plan from the arrays' shapes, dtype and strides
    and runs it.

    q: (batch, seqlen_q, heads_q, head_dim_qk) for layout='bshd' (default) or (batch,
    heads_q, seqlen_q, head_dim_qk) for 'bhsd'; k, v alike with heads_kv (GQA/MQA when
    heads_kv divides heads_q). Any strides with a contiguous last dim work. With
    cu_seqlens_q/k (int32, batch+1), q/k/v are packed (tokens, heads, dim).

    Returns out (same layout and framework as q), or (out, lse) with return_lse=True.
    numpy arrays run on the CPU backend, CUDA arrays on the CUDA backend of their device.
    """
    plan, info = make_plan(q, k, v, causal=causal, window=window, align=align, scale=scale, softcap=softcap,
                           bias=bias, alibi_slopes=alibi_slopes, alibi_symmetric=alibi_symmetric,
                           dropout_p=dropout_p, seed=seed, offset=offset, block_sparse=block_sparse,
                           cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                           max_seqlen_k=max_seqlen_k, layout=layout, deterministic=deterministic,
                           algorithm=algorithm, dtype=dtype, backend=backend, device=device)
    with plan:
        kind = info["q"].kind
        qv = _bshd_view(q, "q", layout, kind)
        kv = _bshd_view(k, "k", layout, kind)
        vv = _bshd_view(v, "v", layout, kind)
        if out is None:
            out = _out_array(info["q"], plan, Tensor.O, layout)
            ov = _bshd_view(out, "out", layout, kind)
        else:
            ov = _bshd_view(out, "out", layout, kind)
            st = ov.strides if plan.varlen is None else (0,) + ov.strides
            shp = ov.shape if plan.varlen is None else (1,) + ov.shape
            plan.set_strides(Tensor.O, _norm_strides(shp, st))
        b = _bias4(bias) if bias is not None else None
        o, l = plan.forward(qv, kv, vv, out=ov, lse=lse, bias=b, alibi_slopes=alibi_slopes,
                            cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, stream=stream,
                            want_lse=return_lse)
    return (out, l) if return_lse else out


def backward(q, k, v, out, lse, dout, *, causal=False, window=None, align="top_left", scale=None, softcap=None,
             bias=None, alibi_slopes=None, alibi_symmetric=False, dropout_p=0.0, seed=None, offset=0,
             block_sparse=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
             layout="bshd", deterministic=None, algorithm=None, dtype=None, backend=None, device=None,
             want_dbias=False, stream=None):
    """Attention backward on arrays, with the same options as :func:`forward` (pass the same
    seed and offset when dropout is on). out and dout must have q's layout (as forward
    returns). Returns (dq, dk, dv) in the layouts of q, k, v, plus dbias (the shape of the
    bias, summed over broadcast dims) with want_dbias=True."""
    if dropout_p and seed is None:
        raise make_error(Status.INVALID_ARGUMENT, "backward with dropout_p=%g needs the seed used by the forward"
                         % dropout_p)
    plan, info = make_plan(q, k, v, causal=causal, window=window, align=align, scale=scale, softcap=softcap,
                           bias=bias, alibi_slopes=alibi_slopes, alibi_symmetric=alibi_symmetric,
                           dropout_p=dropout_p, seed=seed, offset=offset, block_sparse=block_sparse,
                           cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                           max_seqlen_k=max_seqlen_k, layout=layout, deterministic=deterministic,
                           algorithm=algorithm, dtype=dtype, backend=backend, device=device)
    with plan:
        kind = info["q"].kind
        views = {n: _bshd_view(x, n, layout, kind) for n, x in (("q", q), ("k", k), ("v", v), ("out", out),
                                                                ("dout", dout))}
        for n, t in (("out", Tensor.O), ("dout", Tensor.DO)):
            st = views[n].strides if plan.varlen is None else (0,) + views[n].strides
            plan.set_strides(t, _norm_strides(plan.expected_shape(t) if plan.varlen is None
                                              else (1,) + plan.expected_shape(t), st))
        grads = [_bshd_view(_out_array(info["q"], plan, t, layout), n, layout, kind)
                 for n, t in (("dq", Tensor.DQ), ("dk", Tensor.DK), ("dv", Tensor.DV))]
        b = _bias4(bias) if bias is not None else None
        if want_dbias and b is None:
            raise make_error(Status.INVALID_ARGUMENT, "want_dbias=True needs a bias tensor")
        res = plan.backward(views["q"], views["k"], views["v"], views["out"], lse, views["dout"],
                            dq=grads[0], dk=grads[1], dv=grads[2], bias=b,
                            dbias=True if want_dbias else None, alibi_slopes=alibi_slopes,
                            cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, stream=stream)
    dq, dk, dv = (g.owner for g in res[:3])
    if want_dbias:
        db = res[3]  # size 1 along broadcast (zero-stride) dims, which hold the summed gradient
        if len(bias.shape) < 4 and db.shape[:4 - len(bias.shape)] == (1,) * (4 - len(bias.shape)):
            db = db.reshape(db.shape[4 - len(bias.shape):])
        return dq, dk, dv, db
    return dq, dk, dv
