"""torch.autograd integration: flashattn.attention(q, k, v, ...) that trains."""
from __future__ import annotations

import torch

from . import _arrays as A
from ._lib import Status, Tensor, make_error
from ._plan import _bias4, _bshd_view, _norm_strides, _out_array, alloc, make_plan


class FlashAttnFunction(torch.autograd.Function):
    """Forward and backward through libflashattn. Inputs: q, k, v, bias (or None),
    alibi_slopes (or None, not differentiated), cu_seqlens_q/k (or None), opts (dict of
    make_plan options). Returns out."""

    @staticmethod
    def forward(ctx, q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, opts):
        layout = opts.get("layout", "bshd")
        plan, info = make_plan(q, k, v, bias=bias, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q,
                               cu_seqlens_k=cu_seqlens_k, **opts)
        kind = info["q"].kind
        out = _out_array(info["q"], plan, Tensor.O, layout)
        b4 = _bias4(bias) if bias is not None else None
        _, lse = plan.forward(_bshd_view(q, "q", layout, kind), _bshd_view(k, "k", layout, kind),
                              _bshd_view(v, "v", layout, kind), out=_bshd_view(out, "out", layout, kind),
                              bias=b4, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q,
                              cu_seqlens_k=cu_seqlens_k)
        ctx.plan, ctx.info, ctx.layout = plan, info, layout
        ctx.bias_shape = None if bias is None else tuple(bias.shape)
        ctx.save_for_backward(q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, bias, alibi_slopes, cu_q, cu_k = ctx.saved_tensors
        plan, info, layout = ctx.plan, ctx.info, ctx.layout
        kind = info["q"].kind
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        dov = _bshd_view(dout, "dout", layout, kind)
        if plan.varlen is None:
            plan.set_strides(Tensor.DO, _norm_strides(dov.shape, dov.strides))
        else:
            plan.set_strides(Tensor.DO, _norm_strides((1,) + dov.shape, (0,) + dov.strides))
        dq = _out_array(info["q"], plan, Tensor.DQ, layout)
        dk = _out_array(info["q"], plan, Tensor.DK, layout)
        dv = _out_array(info["q"], plan, Tensor.DV, layout)
        b4 = _bias4(bias) if bias is not None else None
        want_dbias = bias is not None and ctx.needs_input_grad[3]
        dbias = None
        if want_dbias:
            dbias = alloc(A.view("bias", b4, kind), tuple(b4.shape), plan._bias_strides, kind)
        res = plan.backward(_bshd_view(q, "q", layout, kind), _bshd_view(k, "k", layout, kind),
                            _bshd_view(v, "v", layout, kind), _bshd_view(out, "out", layout, kind), lse, dov,
                            dq=_bshd_view(dq, "dq", layout, kind), dk=_bshd_view(dk, "dk", layout, kind),
                            dv=_bshd_view(dv, "dv", layout, kind), bias=b4, dbias=dbias,
                            alibi_slopes=alibi_slopes, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        if want_dbias:
            dbias = res[3].reshape(ctx.bias_shape)
        return dq, dk, dv, dbias, None, None, None, None


def attention(q, k, v, *, causal=False, dropout_p=0.0, scale=None, window=None, align="top_left", softcap=None,
              bias=None, alibi_slopes=None, alibi_symmetric=False, seed=None, offset=0, block_sparse=None,
              cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, layout="bshd",
              deterministic=None, algorithm=None):
    """Differentiable attention on torch tensors (CPU or CUDA); see :func:`flashattn.forward`
    for the options. Gradients flow to q, k, v and a bias tensor. With dropout and no seed,
    the seed is drawn from torch's default generator (so torch.manual_seed reproduces it)."""
    if dropout_p and seed is None:
        seed = int(torch.randint(0, 2**62, (), dtype=torch.int64).item())
    if bias is not None and bias.requires_grad:
        # A zero-stride (expanded) dim of size > 1 cannot carry a per-element gradient in
        # the library's dbias; materialize it and let autograd sum through the expand.
        if any(st == 0 and n > 1 for n, st in zip(bias.shape, bias.stride())):
            bias = bias.contiguous()
    if bias is not None and bias.stride(-1) not in (0, 1) and bias.shape[-1] > 1:
        bias = bias.contiguous()
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise make_error(Status.INVALID_ARGUMENT, "attention(): %s must be a torch.Tensor (use "
                             "flashattn.forward for numpy arrays)" % name)
    opts = dict(causal=causal, window=window, align=align, scale=scale, softcap=softcap,
                alibi_symmetric=alibi_symmetric, dropout_p=dropout_p, seed=seed, offset=offset,
                block_sparse=block_sparse, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, layout=layout,
                deterministic=deterministic, algorithm=algorithm)
    return FlashAttnFunction.apply(q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, opts)
