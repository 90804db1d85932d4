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

``flash_attn_with_kvcache`` runs new query tokens against a KV cache (contiguous, or paged
through ``block_table`` with any page size), appending ``k``/``v`` in place (rotated with
``rotary_cos``/``rotary_sin``) first; it takes no gradient, as in FA2.

Differences, each refused with a :class:`flashattn.NotSupportedError` naming the
argument: ``return_attn_probs=True`` (the probabilities are never materialized),
``block_table`` in the varlen functions (paged KV is served by ``flash_attn_with_kvcache``)
and ``cache_leftpad``. float32 inputs are
accepted as well as float16/bfloat16. Dropout masks come from libflashattn's
own Philox stream, seeded from torch's default generator, so they differ from FA2's.
"""
from __future__ import annotations

import torch

from ._lib import Status, make_error
from ._torch import attention
from ._torch_kvcache import run as _run_kvcache


def _check(alibi_slopes, return_attn_probs, block_table=None):
    if return_attn_probs:
        raise make_error(Status.NOT_SUPPORTED, "return_attn_probs=True: libflashattn never materializes the "
                         "attention probabilities; call with return_attn_probs=False (the output alone is returned)")
    if block_table is not None:
        raise make_error(Status.NOT_SUPPORTED, "block_table: the varlen functions take contiguous k and v; a "
                         "paged KV cache is served by flash_attn_with_kvcache")


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


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """Attention of q against a KV cache, appending k and v to it in place first (FA2's
    ``flash_attn_with_kvcache``).

    q (batch, seqlen_q, heads, d); k_cache/v_cache (batch_cache, seqlen_cache, heads_kv, d),
    or with block_table (batch, max_pages) int32 a page pool (num_pages, page_size,
    heads_kv, d) of any page size; k/v (batch, seqlen_new, heads_kv, d) are written at
    positions cache_seqlens[b] .. + seqlen_new - 1, rotated first when rotary_cos/sin
    (positions, rotary_dim / 2) are given (q too: at cache_seqlens[b] + i when causal or
    local, else at cache_seqlens[b]; rotary_interleaved picks GPT-J pairs over GPT-NeoX
    halves). cache_seqlens: int or int32 (batch,), the keys already cached (None: the whole
    cache, only without k/v); cache_batch_idx int32 (batch,): the cache row of each sequence.
    causal/window/ALiBi are aligned bottom-right against cache_seqlens[b] + seqlen_new.
    num_splits: 0 lets the library choose the key splits. Returns out (batch, seqlen_q, heads,
    d), or (out, softmax_lse (batch, heads, seqlen_q) fp32) with return_softmax_lse=True.
    On CUDA the library's answer is surfaced as is (NotSupportedError for fp32, which the
    CUDA kernels do not take)."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k_cache, v_cache)):
        raise make_error(Status.INVALID_ARGUMENT, "flash_attn_with_kvcache: q, k_cache and v_cache must be "
                         "torch.Tensors (flashattn.forward_kvcache takes numpy arrays)")
    if cache_leftpad is not None:
        raise make_error(Status.NOT_SUPPORTED, "cache_leftpad: libflashattn's KV cache has no left padding; the "
                         "keys of each sequence start at position 0 of its cache row or first page (pass "
                         "cache_leftpad=None)")
    _check(alibi_slopes, False)
    if cache_seqlens is None:
        if k is not None or v is not None:
            raise make_error(Status.NULL_POINTER, "cache_seqlens is None but k/v are given: appending needs the "
                             "number of keys already cached per sequence")
        cache_seqlens = k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=k_cache.device)
    left, right = _window(window_size)
    if causal:
        right = 0
    opts = (-1 if left is None else left, -1 if right is None else right, float(softmax_scale or 0.0),
            float(softcap or 0.0), bool(rotary_interleaved), int(num_splits))
    out, lse = _run_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                            block_table, alibi_slopes, opts, return_softmax_lse)
    return (out, lse) if return_softmax_lse else out


__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache"]
