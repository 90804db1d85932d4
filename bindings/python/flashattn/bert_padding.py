"""Padding helpers for variable-length batches, with the signatures and results of
FlashAttention 2's ``flash_attn.bert_padding``: drop the padding tokens of a
(batch, seqlen, ...) tensor before a varlen call and put them back after it."""
from __future__ import annotations

import torch


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """Gather the real tokens of a padded batch.

    hidden_states: (batch, seqlen, ...). attention_mask: (batch, seqlen), bool or int,
    nonzero = a real token. unused_mask: (batch, seqlen) or None, nonzero = a token that is
    allocated but unused (kept in the packed tensor, not counted in seqused).

    Returns (hidden_states (total, ...), indices (total,) int64 into the flattened batch,
    cu_seqlens (batch + 1,) int32, max_seqlen_in_batch (int), seqused (batch,) int32).
    Reading max_seqlen_in_batch synchronizes with a CUDA device, as in FlashAttention 2.
    """
    all_masks = (attention_mask + unused_mask) if unused_mask is not None else attention_mask
    seqlens = all_masks.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape((-1,) + tuple(hidden_states.shape[2:]))
    return flat[indices], indices, cu_seqlens, max_seqlen, used


def pad_input(hidden_states, indices, batch, seqlen):
    """Scatter packed tokens (total, ...) back to (batch, seqlen, ...), zeros elsewhere."""
    out = hidden_states.new_zeros((batch * seqlen,) + tuple(hidden_states.shape[1:]))
    out = out.index_put((indices,), hidden_states)
    return out.reshape((batch, seqlen) + tuple(hidden_states.shape[1:]))


__all__ = ["pad_input", "unpad_input"]
