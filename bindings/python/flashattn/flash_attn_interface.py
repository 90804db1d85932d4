"""Drop-in replacements for FlashAttention 2's ``flash_attn.flash_attn_interface``.

Same names, arguments, defaults and semantics as FlashAttention 2 (2.6+):

* tensors are (batch, seqlen, heads, head_dim), or (total_tokens, heads, head_dim) for
  the varlen functions; heads_kv may divide heads (MQA/GQA);
* ``causal`` and ``window_size=(left, right)`` are aligned to the bottom-right corner
  of the attention matrix: query i attends to keys j with
  ``i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right``
  (-1 = unbounded; causal sets right = 0), per sequence for varlen;
* ``alibi_slopes`` (heads,) or (batch, heads) fp32 adds
  ``-slope * |i + seqlen_k - seqlen_q - j|`` (slope of the sequence and head);
* ``softcap`` > 0 applies ``softcap * tanh(s / softcap)`` to the scores;
* ``dropout_p`` drops attention probabilities (pass 0.0 in evaluation, as with FA2);
* ``deterministic`` makes the backward pass reproducible.

Differences, each refused with a :class:`flashattn.NotSupportedError` naming the
argument: ``return_attn_probs=True`` (the probabilities are never materialized) and
``block_table`` (paged KV cache). float32
inputs are accepted as well as float16/bfloat16. Dropout masks come from libflashattn's
own Philox stream, seeded from torch's default generator, so they differ from FA2's.
"""
from __future__ import annotations

from ._lib import Status, make_error
from ._torch import attention


def _check(alibi_slopes, return_attn_probs, block_table=None):
    if return_attn_probs:
        raise make_error(Status.NOT_SUPPORTED, "return_attn_probs=True: libflashattn never materializes the "
                         "attention probabilities; call with return_attn_probs=False (the output alone is returned)")
    if block_table is not None:
        raise make_error(Status.NOT_SUPPORTED, "block_table: a paged KV cache is not supported; pass contiguous "
                         "k and v")


def _window(window_size):
    left, right = window_size
    return (None if left < 0 else int(left), None if right < 0 else int(right))


def _run(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, **varlen):
    left, right = _window(window_size)
    if causal:
        right = 0
    return attention(q, k, v, causal=False, window=(left, right), align="bottom_right", dropout_p=dropout_p,
                     scale=softmax_scale, softcap=softcap or None, alibi_slopes=alibi_slopes,
                     alibi_symmetric=True, deterministic=bool(deterministic), **varlen)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (batch, seqlen_q, heads, d), k/v (batch, seqlen_k, heads_kv, d) -> out like q."""
    _check(alibi_slopes, return_attn_probs)
    return _run(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv (batch, seqlen, 3, heads, d) -> out (batch, seqlen, heads, d)."""
    _check(alibi_slopes, return_attn_probs)
    return _run(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, window_size, softcap,
                alibi_slopes, deterministic)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (batch, seqlen_q, heads, d), kv (batch, seqlen_k, 2, heads_kv, d) -> out like q."""
    _check(alibi_slopes, return_attn_probs)
    return _run(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                deterministic)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """q (total_q, heads, d), k/v (total_k, heads_kv, d), cu_seqlens int32 (batch + 1,)."""
    _check(alibi_slopes, return_attn_probs, block_table)
    return _run(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                max_seqlen_k=max_seqlen_k)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv (total, 3, heads, d) -> out (total, heads, d)."""
    _check(alibi_slopes, return_attn_probs)
    return _run(qkv[:, 0], qkv[:, 1], qkv[:, 2], dropout_p, softmax_scale, causal, window_size, softcap,
                alibi_slopes, deterministic, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
                max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (total_q, heads, d), kv (total_k, 2, heads_kv, d) -> out like q."""
    _check(alibi_slopes, return_attn_probs)
    return _run(q, kv[:, 0], kv[:, 1], dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                deterministic, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                max_seqlen_k=max_seqlen_k)


__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func"]
