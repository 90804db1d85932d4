"""KV-cache runs on arrays (decode, chunked prefill): the plan built from the arrays'
shapes and strides, and :func:`forward_kvcache` (docs/inference.md)."""
from __future__ import annotations

from . import _arrays as A
from ._lib import DType, Status, Tensor, make_error
from ._plan import Plan, _alibi_batch_stride, _dense_like, _norm_strides


def _view4(name, x, kind=None):
    v = A.view(name, x, kind)
    if v is not None and len(v.shape) != 4:
        raise make_error(Status.INVALID_SHAPE, "%s has shape %s; it must be 4-D %s" % (
            name, v.shape, "(batch, seq, heads, dim)" if name in ("q", "k", "v") else
            "(rows or pages, tokens, heads_kv, dim)"))
    return v


def make_kvcache_plan(q, k_cache, v_cache, *, k=None, v=None, rotary_cos=None, rotary_interleaved=False,
                      block_table=None, causal=False, window=None, scale=None, softcap=None, alibi_slopes=None,
                      alibi_symmetric=False, num_splits=0, backend=None, device=None):
    """The Plan in KV-cache mode that :func:`forward_kvcache` runs for these arrays.

    q (batch, seqlen_q, heads_q, d); caches (rows, capacity, heads_kv, d), or with a block
    table (batch, pages per sequence) a pool (pages, page_size, heads_kv, d) and a capacity
    of pages per sequence x page_size; k/v (batch, seqlen_new, heads_kv, d) are appended;
    rotary_cos (positions, rotary_dim / 2). Strides are taken from the arrays. The band
    mask and ALiBi are aligned bottom-right against each sequence's keys."""
    qv = _view4("q", q)
    if qv.kind not in (A.F16, A.BF16, A.F32):
        raise make_error(Status.DTYPE_NOT_SUPPORTED, "q has element type %s; use float16, bfloat16 or float32"
                         % qv.kind)
    kc, vc = _view4("k_cache", k_cache, qv.kind), _view4("v_cache", v_cache, qv.kind)
    kn, vn = _view4("k", k, qv.kind), _view4("v", v, qv.kind)
    if (kn is None) != (vn is None):
        raise make_error(Status.NULL_POINTER, "k and v are appended together: %s is None but %s is not"
                         % (("k", "v") if kn is None else ("v", "k")))
    batch, seqlen_q, heads_q, _ = qv.shape
    rows, tokens, heads_kv, dqk = kc.shape
    page_size, max_pages, capacity = 0, 0, tokens
    if block_table is not None:
        bt = A.view("block_table", block_table, A.I32)
        if len(bt.shape) != 2 or bt.shape[1] < 1:
            raise make_error(Status.INVALID_SHAPE, "block_table has shape %s; it must be (batch, max_pages_per_seq) "
                             "with at least one column" % (bt.shape,))
        page_size, max_pages, capacity = tokens, bt.shape[1], tokens * bt.shape[1]
    rotary, rotary_dim, rotary_rows = None, 0, 0
    if rotary_cos is not None:
        rc = A.view("rotary_cos", rotary_cos, qv.kind)
        if len(rc.shape) != 2:
            raise make_error(Status.INVALID_SHAPE, "rotary_cos has shape %s; it must be (positions, rotary_dim / 2)"
                             % (rc.shape,))
        rotary = "interleaved" if rotary_interleaved else "half"
        rotary_rows, rotary_dim = rc.shape[0], 2 * rc.shape[1]
    if backend is None:
        backend = "cuda" if qv.is_cuda else "cpu"
    if device is None:
        device = qv.device[1] if qv.is_cuda and qv.device[1] is not None else 0
    dt = {A.F16: DType.FP16, A.BF16: DType.BF16, A.F32: DType.FP32}[qv.kind]
    plan = Plan(batch, seqlen_q, capacity, heads_q, heads_kv, dqk, vc.shape[3], dtype=dt, backend=backend,
                device=device)
    try:
        q_strides = _norm_strides(qv.shape, qv.strides)
        plan.set_strides(Tensor.Q, q_strides)
        plan.set_strides(Tensor.O, _dense_like((batch, seqlen_q, heads_q, vc.shape[3]), q_strides))
        plan.set_mask(causal, window, "bottom_right")
        if scale is not None:
            plan.set_scale(scale)
        if softcap:
            plan.set_softcap(softcap)
        if alibi_slopes is not None:
            plan.set_alibi(symmetric=alibi_symmetric, batch_stride=_alibi_batch_stride(alibi_slopes, batch, heads_q))
        plan.set_kvcache(rows, page_size=page_size, max_pages_per_seq=max_pages,
                         k_cache_strides=_norm_strides(kc.shape, kc.strides),
                         v_cache_strides=_norm_strides(vc.shape, vc.strides),
                         seqlen_new=kn.shape[1] if kn is not None else 0,
                         k_new_strides=_norm_strides(kn.shape, kn.strides) if kn is not None else None,
                         v_new_strides=_norm_strides(vn.shape, vn.strides) if vn is not None else None,
                         rotary=rotary, rotary_dim=rotary_dim, rotary_rows=rotary_rows, num_splits=num_splits)
    except BaseException:
        plan.close()
        raise
    return plan


def forward_kvcache(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None, rotary_cos=None, rotary_sin=None,
                    rotary_interleaved=False, cache_batch_idx=None, block_table=None, causal=False, window=None,
                    scale=None, softcap=None, alibi_slopes=None, alibi_symmetric=False, num_splits=0, out=None,
                    return_lse=False, stream=None):
    """Attention of new query tokens against a KV cache, on arrays (numpy on the CPU
    backend, CUDA arrays on the CUDA backend of their device); see :func:`make_kvcache_plan`
    for the shapes. cache_seqlens int32 (batch,): keys already cached per sequence;
    cache_batch_idx int32 (batch,): the cache row of each sequence (contiguous caches);
    block_table int32 (batch, pages per sequence). With k and v, they are written into the
    caches in place (rotated with rotary_cos/sin), then sequence b attends to its first
    cache_seqlens[b] + seqlen_new keys. Returns out (like q), or (out, lse) with
    return_lse=True."""
    plan = make_kvcache_plan(q, k_cache, v_cache, k=k, v=v, rotary_cos=rotary_cos,
                             rotary_interleaved=rotary_interleaved, block_table=block_table, causal=causal,
                             window=window, scale=scale, softcap=softcap, alibi_slopes=alibi_slopes,
                             alibi_symmetric=alibi_symmetric, num_splits=num_splits)
    with plan:
        o, lse = plan.forward_kvcache(q, k_cache, v_cache, cache_seqlens, out=out, cache_batch_idx=cache_batch_idx,
                                      block_table=block_table, k_new=k, v_new=v, rotary_cos=rotary_cos,
                                      rotary_sin=rotary_sin, alibi_slopes=alibi_slopes, stream=stream,
                                      want_lse=return_lse)
    return (o, lse) if return_lse else o
