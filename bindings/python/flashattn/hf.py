"""Hugging Face Transformers integration: register libflashattn as an attention
implementation, then load or build models with ``attn_implementation=<name>``::

    import flashattn.hf
    name = flashattn.hf.register()                  # "libfa"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=name)

Transformers refuses implementation names that contain "flash" (they are reserved for
its own FlashAttention paths), hence the default "libfa". Grouped-query attention runs
without repeating k/v heads; padding arrives as a (batch, seqlen_k) mask (the mask
function registered alongside is Transformers' own for flash attention where it has
one) and becomes a key-padding bias, while causal masks are aligned to the bottom-right
corner so a query block that continues a KV cache attends to the whole prefix.
"""
from __future__ import annotations

import torch

from ._lib import Status, make_error
from ._torch import attention

DEFAULT_NAME = "libfa"


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                      softcap=None, **kwargs):
    """The attention function Transformers calls: query (batch, heads, seqlen_q, d), key and
    value (batch, heads_kv, seqlen_k, d), attention_mask None, (batch, seqlen_k) padding
    (nonzero = token) or a 4-D mask (bool True = keep, or additive). Returns (out (batch,
    seqlen_q, heads, d), None)."""
    causal = kwargs.get("is_causal")
    if causal is None:
        causal = getattr(module, "is_causal", True)
    causal = bool(causal) and query.shape[2] > 1
    padding, mask = None, None
    if attention_mask is not None:
        if attention_mask.dim() == 2:
            padding = attention_mask.bool()
            short = key.shape[2] - padding.shape[1]
            if short > 0:  # a static cache: the slots past the mask hold no token yet
                padding = torch.nn.functional.pad(padding, (0, short), value=False)
        else:
            mask, causal = attention_mask, False  # a 4-D mask already holds the causal part
    window = None
    if sliding_window:
        window = (int(sliding_window) - 1, None if causal else int(sliding_window) - 1)
    out = attention(query, key, value, causal=causal, align="bottom_right", window=window, scale=scaling,
                    softcap=softcap, dropout_p=dropout, attn_mask=mask, key_padding_mask=padding, layout="bhsd")
    return out.transpose(1, 2), None


def register(name=DEFAULT_NAME):
    """Register :func:`attention_forward` (and a mask function) with Transformers under
    `name`; returns the name to pass as ``attn_implementation``."""
    if "flash" in name:
        raise make_error(Status.INVALID_ARGUMENT, "name=%r: Transformers refuses attention implementation names "
                         "containing 'flash'" % (name,))
    try:
        from transformers import AttentionInterface
    except ImportError as e:
        raise make_error(Status.NOT_SUPPORTED, "register(): transformers with AttentionInterface (4.48 or later) is "
                         "not importable (%s)" % e) from e
    AttentionInterface.register(name, attention_forward)
    try:
        from transformers import AttentionMaskInterface
        from transformers.masking_utils import flash_attention_mask
    except ImportError:
        pass  # older releases build the mask from the implementation name's defaults
    else:
        AttentionMaskInterface.register(name, flash_attention_mask)
    return name


__all__ = ["DEFAULT_NAME", "attention_forward", "register"]
