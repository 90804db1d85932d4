"""How attention on torch tensors reaches the plan cache, with autograd: :func:`run`.

Eager calls go through an autograd.Function (or no autograd at all when no input needs
a gradient): a few microseconds of Python. Under torch.compile the same work is the
torch.library custom ops ``flashattn::fwd`` and ``flashattn::bwd``, with fake (meta)
implementations and autograd, so a compiled graph holds them without a break.

q, k, v are in (batch, seq, heads, dim) order with any strides (3-D (tokens, heads, dim)
with cu_seqlens); bias is 4-D or None; the options are scalars (see :data:`OPTIONS`).
With the compiled extension on (:mod:`flashattn.torch_ext`), an eager call runs as its
C++ op instead, autograd, varlen, bias, ALiBi, dropout (on the same ``rng``) and host
block-sparse layouts included. Nothing here synchronizes with the device.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _torch_plans as P

#: The scalar options of both ops, in order (the plan-cache key is this tuple of values).
OPTIONS = ("max_seqlen_q", "max_seqlen_k", "window_left", "window_right", "bottom_right", "scale", "softcap",
           "alibi_symmetric", "dropout_p", "block_q", "block_k", "deterministic", "algorithm")


@torch.library.custom_op("flashattn::fwd", mutates_args=())
def fwd(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], alibi_slopes: Optional[Tensor],
        cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], block_layout: Optional[Tensor],
        rng: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, window_left: int, window_right: int,
        bottom_right: bool, scale: float, softcap: float, alibi_symmetric: bool, dropout_p: float, block_q: int,
        block_k: int, deterministic: bool, algorithm: int) -> Tuple[Tensor, Tensor]:
    """(out, lse): out like q with v's head dim, lse fp32 (batch, heads, seq) or (heads, tokens)."""
    return P.forward(q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, block_layout, rng,
                     (max_seqlen_q, max_seqlen_k, window_left, window_right, bottom_right, scale, softcap,
                      alibi_symmetric, dropout_p, block_q, block_k, deterministic, algorithm), True)


@fwd.register_fake
def _fwd_fake(q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, block_layout, rng, *scalars):
    out, _, _, _, lse = P.layouts(q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride())
    return q.new_empty_strided(out[0], out[1]), q.new_empty(lse, dtype=torch.float32)


@torch.library.custom_op("flashattn::bwd", mutates_args=())
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, bias: Optional[Tensor],
        alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
        block_layout: Optional[Tensor], rng: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
        window_left: int, window_right: int, bottom_right: bool, scale: float, softcap: float,
        alibi_symmetric: bool, dropout_p: float, block_q: int, block_k: int, deterministic: bool, algorithm: int,
        want_dbias: bool) -> List[Tensor]:
    """[dq, dk, dv, dbias]; dbias has the bias's shape (summed over its broadcast dims), or
    is an empty tensor unless want_dbias."""
    dq, dk, dv, dbias = P.backward(dout, q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                                   block_layout, rng,
                                   (max_seqlen_q, max_seqlen_k, window_left, window_right, bottom_right, scale,
                                    softcap, alibi_symmetric, dropout_p, block_q, block_k, deterministic, algorithm),
                                   want_dbias)
    return [dq, dk, dv, dbias if dbias is not None else q.new_empty(0)]


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, block_layout, rng, *rest):
    want_dbias = rest[-1]
    _, dq, dk, dv, _ = P.layouts(q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride())
    grads = [q.new_empty_strided(shp, st) for shp, st in (dq, dk, dv)]
    if want_dbias:
        bst = tuple(0 if n == 1 else s for n, s in zip(bias.shape, bias.stride()))
        grads.append(q.new_empty_strided(bias.shape, bst))
    else:
        grads.append(q.new_empty(0))
    return grads


_N_TENSORS = 9  # q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, block_layout, rng


def _setup_context(ctx, inputs, output):
    ctx.scalars = tuple(inputs[_N_TENSORS:])
    out, lse = output
    ctx.save_for_backward(*inputs[:3], out, lse, *inputs[3:_N_TENSORS])


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, bias, slopes, cu_q, cu_k, layout, rng = ctx.saved_tensors
    want_dbias = bias is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dbias = bwd(dout, q, k, v, out, lse, bias, slopes, cu_q, cu_k, layout, rng, *ctx.scalars,
                            want_dbias)
    return (dq, dk, dv, dbias if want_dbias else None) + (None,) * (_N_TENSORS - 4 + len(OPTIONS))


fwd.register_autograd(_backward, setup_context=_setup_context)


class _Attention(torch.autograd.Function):
    """The eager path: the plan cache called directly (the custom op's dispatch costs tens
    of microseconds per call). The backward runs on the cache entry its forward looked up,
    which stays valid if the cache drops it in between, unless the saved tensors come back
    with other strides (saved-tensor hooks such as torch.autograd.graph.save_on_cpu may
    return dense copies): then it looks up the entry of those."""

    @staticmethod
    def forward(ctx, q, k, v, bias, alibi_slopes, cu_q, cu_k, block_layout, rng, opts):
        ctx.entry = e = P.entry(q, k, v, bias, alibi_slopes, cu_q, cu_k, block_layout, opts)
        ctx.block_layout, ctx.opts = block_layout, opts
        out, lse = P.run_forward(e, q, k, v, bias, alibi_slopes, cu_q, cu_k, rng, True)
        ctx.save_for_backward(q, k, v, out, lse, bias, alibi_slopes, cu_q, cu_k, rng)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, bias, slopes, cu_q, cu_k, rng = ctx.saved_tensors
        want_dbias = bias is not None and ctx.needs_input_grad[3]
        e = ctx.entry
        if P.input_layout(q, k, v, bias, slopes, cu_q, cu_k) != e.input_layout:
            e = P.entry(q, k, v, bias, slopes, cu_q, cu_k, ctx.block_layout, ctx.opts)
        dq, dk, dv, dbias = P.run_backward(e, dout, q, k, v, out, lse, bias, slopes, cu_q, cu_k, rng, want_dbias)
        return dq, dk, dv, dbias, None, None, None, None, None, None


_ext = None  # the compiled extension's attention(), set by use_extension


def use_extension(module):
    """Send eager calls it serves through the compiled extension `module` (None: never)."""
    global _ext
    _ext = None if module is None else module.attention


def run(q, k, v, bias, alibi_slopes, cu_q, cu_k, block_layout, rng, opts):
    """The attention output for these tensors and the option tuple (see :data:`OPTIONS`)."""
    if torch.compiler.is_compiling():
        return fwd(q, k, v, bias, alibi_slopes, cu_q, cu_k, block_layout, rng, *opts)[0]
    if _ext is not None:
        out = _ext(q, k, v, bias, alibi_slopes, cu_q, cu_k, block_layout, rng, *opts)
        if out is not None:
            return out
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return _Attention.apply(q, k, v, bias, alibi_slopes, cu_q, cu_k, block_layout, rng, opts)
    return P.forward(q, k, v, bias, alibi_slopes, cu_q, cu_k, block_layout, rng, opts, False)[0]


def _use_a_prebuilt_extension():
    from . import torch_ext
    torch_ext.load_at_first_call()


_use_a_prebuilt_extension()
