"""flashattn.attention for torch tensors: options, masks, layouts and autocast turned into
one call of the ``flashattn::fwd`` custom op (differentiable, torch.compile-able)."""
from __future__ import annotations

import torch

from ._lib import Algorithm, Align, Status, make_error
from ._plan import _ALGO_NAMES, _ALIGN_NAMES, _enum
from ._torch_ops import run

def mask_to_bias(mask, dtype):
    """An additive bias from a mask as SDPA takes it: bool (True = keep) becomes 0 / -inf,
    a float mask is added as it is (cast to dtype)."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    if not mask.is_floating_point():
        raise make_error(Status.INVALID_ARGUMENT, "attn_mask has dtype %s; use bool (True = keep) or a float "
                         "additive mask" % mask.dtype)
    return mask.to(dtype)


def _window(causal, window, align):
    """(window_left, window_right, bottom_right) as the C band mask takes them."""
    if window is None and align == "top_left":
        return -1, (0 if causal else -1), False
    bottom_right = _enum(_ALIGN_NAMES, Align, align, "align") == Align.BOTTOM_RIGHT
    left, right = (None, None) if window is None else tuple(window)
    left = -1 if left is None or left < 0 else int(left)
    right = -1 if right is None or right < 0 else int(right)
    if causal:
        if right > 0:
            raise make_error(Status.INCOMPATIBLE_OPTIONS, "causal=True with window right=%d: causal means right=0"
                             % right)
        right = 0
    return left, right, bottom_right


def _dropout_rng(seed, offset):
    """Philox (seed, offset) as a host int64 tensor; the seed is drawn from torch's default
    generator when not given (so torch.manual_seed reproduces a run)."""
    if seed is None:
        return torch.cat([torch.randint(0, 2**62, (1,), dtype=torch.int64),
                          torch.full((1,), int(offset), dtype=torch.int64)])
    return torch.tensor([int(seed), int(offset)], dtype=torch.int64)


def _max_len(cu, given):
    if given is not None:
        return int(given)
    return int((cu[1:] - cu[:-1]).max().item()) if cu.numel() > 1 else 0  # a host sync on CUDA


def attention(q, k, v, *, causal=False, dropout_p=0.0, scale=None, window=None, align="top_left", softcap=None,
              bias=None, attn_mask=None, key_padding_mask=None, alibi_slopes=None, alibi_symmetric=False, seed=None,
              offset=0, block_sparse=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
              max_seqlen_k=None, layout="bshd", deterministic=None, algorithm=None):
    """Differentiable attention on torch tensors (CPU or CUDA); see :func:`flashattn.forward`
    for the options. attn_mask: bool (True = keep, as SDPA) or float additive, broadcastable
    to (batch, heads_q, seqlen_q, seqlen_k); key_padding_mask: bool (batch, seqlen_k), True =
    a real token. Gradients flow to q, k, v and a float bias. Under autocast, floating
    inputs are cast to the autocast dtype (as SDPA is); otherwise q, k, v must share a dtype.
    With dropout and no seed, the seed is drawn from torch's default generator. With
    cu_seqlens, pass max_seqlen_q/k: computing them reads the offsets (a host sync on CUDA,
    a graph break under torch.compile)."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        name = next(n for n, t in (("q", q), ("k", k), ("v", v)) if not isinstance(t, torch.Tensor))
        raise make_error(Status.INVALID_ARGUMENT, "attention(): %s must be a torch.Tensor (use flashattn.forward "
                         "for numpy arrays)" % name)
    if torch._C._is_any_autocast_enabled():
        q, k, v = _autocast(q, k, v)
    if layout == "bhsd":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    elif layout not in ("bshd", "thd"):
        raise make_error(Status.INVALID_ARGUMENT, "layout=%r is not 'bshd', 'bhsd' or 'thd'" % (layout,))
    if bias is not None or attn_mask is not None or key_padding_mask is not None:
        bias = _combined_bias(q, bias, attn_mask, key_padding_mask)
    left, right, bottom_right = _window(causal, window, align)
    mq = mk = 0
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            raise make_error(Status.NULL_POINTER, "variable-length mode needs both cu_seqlens_q and cu_seqlens_k")
        mq, mk = _max_len(cu_seqlens_q, max_seqlen_q), _max_len(cu_seqlens_k, max_seqlen_k)
    layout_t, bq, bk = None, 0, 0
    if block_sparse is not None:
        lay, bq, bk = block_sparse
        layout_t = torch.as_tensor(lay).to(torch.uint8)
    algo = 0 if algorithm is None else int(_enum(_ALGO_NAMES, Algorithm, algorithm, "algorithm"))
    rng = _dropout_rng(seed, offset) if dropout_p else None
    opts = (mq, mk, left, right, bottom_right, float(scale or 0.0), float(softcap or 0.0), bool(alibi_symmetric),
            float(dropout_p), int(bq), int(bk), bool(deterministic), algo)
    out = run(q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, layout_t, rng, opts)
    return out.transpose(1, 2) if layout == "bhsd" else out


def _autocast(q, k, v):
    """q, k, v cast to the autocast dtype of their device when autocast is on there."""
    dev = q.device.type
    if torch.is_autocast_enabled(dev) and q.is_floating_point():
        dt = torch.get_autocast_dtype(dev)
        return q.to(dt), k.to(dt), v.to(dt)
    return q, k, v


def _combined_bias(q, bias, attn_mask, key_padding_mask):
    """One 4-D additive bias from bias, attn_mask and key_padding_mask (None if none)."""
    parts = []
    if bias is not None:
        parts.append(bias.to(q.dtype) if bias.is_floating_point() and bias.dtype != q.dtype else bias)
    if attn_mask is not None:
        parts.append(mask_to_bias(attn_mask, q.dtype))
    if key_padding_mask is not None:
        if key_padding_mask.dim() != 2:
            raise make_error(Status.INVALID_SHAPE, "key_padding_mask has shape %s; it must be (batch, seqlen_k)"
                             % (tuple(key_padding_mask.shape),))
        parts.append(mask_to_bias(key_padding_mask.to(torch.bool), q.dtype)[:, None, None, :])
    if not parts:
        return None
    b = parts[0]
    for p in parts[1:]:
        b = b + p
    if b.dim() > 4:
        raise make_error(Status.INVALID_SHAPE, "bias has %d dimensions; at most 4 (batch, heads, q, k)" % b.dim())
    b = b.reshape((1,) * (4 - b.dim()) + tuple(b.shape))
    if b.requires_grad and any(st == 0 and n > 1 for n, st in zip(b.shape, b.stride())):
        # A zero-stride (expanded) dim of size > 1 cannot carry a per-element gradient in
        # the library's dbias; materialize it and let autograd sum through the expand.
        b = b.contiguous()
    if b.stride(-1) not in (0, 1) and b.shape[-1] > 1:
        b = b.contiguous()
    return b
