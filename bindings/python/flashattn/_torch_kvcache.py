"""KV-cache runs on torch tensors: plans in the plan cache of :mod:`flashattn._torch_plans`
keyed by every tensor's shape, strides, dtype and device and the options, one
``flashattn_fwd_kvcache`` call per run, and the torch.library custom op
``flashattn::fwd_kvcache`` (k_cache and v_cache declared mutated: new keys and values are
appended in place) with a fake implementation, so torch.compile holds it in a graph.

Inference only: no gradient flows through a KV-cache run. Nothing here synchronizes with
the device.
"""
from __future__ import annotations

import ctypes
import struct
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _lib as L
from . import _torch_plans as P
from ._kvcache import make_kvcache_plan
from ._lib import Pass, Tensor as T

# flashattn_kvcache_args_t packed from integers: struct_size, then 13 pointers in field order.
_ARGS = struct.Struct("@N13P")
assert _ARGS.size == ctypes.sizeof(L.KvcacheArgs)

#: The scalar options of the op, in order (part of the plan-cache key).
OPTIONS = ("window_left", "window_right", "scale", "softcap", "rotary_interleaved", "num_splits")


class _Entry:
    """One cached KV-cache plan with its output layouts and workspace size (and the fields
    of _torch_plans.adopt)."""

    __slots__ = ("plan", "handle", "cuda", "out", "lse", "ws", "dropout_p", "lock")

    def __init__(self, q, inputs, opts):
        left, right, scale, softcap, interleaved, num_splits = opts
        plan = make_kvcache_plan(
            q, inputs["k_cache"], inputs["v_cache"], k=inputs["k_new"], v=inputs["v_new"],
            rotary_cos=inputs["rotary_cos"], rotary_interleaved=interleaved, block_table=inputs["block_table"],
            window=(left if left >= 0 else None, right if right >= 0 else None), scale=scale or None,
            softcap=softcap or None, alibi_slopes=inputs["alibi_slopes"], alibi_symmetric=True,
            num_splits=num_splits)
        try:
            backend = plan.backend
            arrays = {n: t for n, t in inputs.items() if n != "alibi_slopes"}
            plan._kvcache_views(backend, arrays, None)
            plan._common_inputs(backend, None, inputs["alibi_slopes"], None, None, None)
            self.out = (plan.expected_shape(T.O), plan.strides(T.O))
            self.lse = plan.lse_shape()
            self.ws = plan.workspace_size(Pass.FORWARD_KVCACHE)
        except BaseException:
            plan.close()
            raise
        P.adopt(self, plan, backend, 0.0)


def forward(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, block_table,
            alibi_slopes, opts, want_lse):
    """(out, lse) of one KV-cache run (lse None unless want_lse); the caches are written in
    place when k_new/v_new are given. A plan-cache miss checks every tensor."""
    inputs = dict(k_cache=k_cache, v_cache=v_cache, k_new=k_new, v_new=v_new, rotary_cos=rotary_cos,
                  rotary_sin=rotary_sin, cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
                  block_table=block_table, alibi_slopes=alibi_slopes)
    key = ("kvcache", P._desc(q)) + tuple(P._desc(t) for t in inputs.values()) + (opts,)
    e = P.cached(key, lambda: _Entry(q, inputs, opts))
    dev = q.device
    out = torch.empty_strided(e.out[0], e.out[1], dtype=q.dtype, device=dev)
    lse = torch.empty(e.lse, dtype=torch.float32, device=dev) if want_lse else None
    p = P._ptr
    args = _ARGS.pack(_ARGS.size, q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), p(lse),
                      p(cache_seqlens), p(cache_batch_idx), p(block_table), p(k_new), p(v_new), p(rotary_cos),
                      p(rotary_sin), p(alibi_slopes))
    P._run(e, P._cfunc("flashattn_fwd_kvcache"), "flashattn_fwd_kvcache", args, e.ws, q, None)
    return out, lse


@torch.library.custom_op("flashattn::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def fwd_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_new: Optional[Tensor], v_new: Optional[Tensor],
                rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor], cache_seqlens: Tensor,
                cache_batch_idx: Optional[Tensor], block_table: Optional[Tensor], alibi_slopes: Optional[Tensor],
                window_left: int, window_right: int, scale: float, softcap: float, rotary_interleaved: bool,
                num_splits: int) -> Tuple[Tensor, Tensor]:
    """(out, lse): out like q with v_cache's head dim, lse fp32 (batch, heads_q, seqlen_q).
    k_cache and v_cache receive k_new and v_new (when given) in place."""
    return forward(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                   block_table, alibi_slopes,
                   (window_left, window_right, scale, softcap, rotary_interleaved, num_splits), True)


@fwd_kvcache.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, *rest):
    out, _, _, _, lse = P.layouts(q.shape, q.stride(), k_cache.shape, k_cache.stride(), v_cache.shape,
                                  v_cache.stride())
    return q.new_empty_strided(out[0], out[1]), q.new_empty(lse, dtype=torch.float32)


def run(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, block_table,
        alibi_slopes, opts, want_lse):
    """(out, lse or None): the custom op under torch.compile, else the plan cache directly
    (the op's dispatch costs tens of microseconds per call)."""
    if torch.compiler.is_compiling():
        out, lse = fwd_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens,
                               cache_batch_idx, block_table, alibi_slopes, *opts)
        return out, (lse if want_lse else None)
    return forward(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                   block_table, alibi_slopes, opts, want_lse)
