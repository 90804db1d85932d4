"""fp64 reference of a KV-cache run as docs/inference.md and FA2's flash_attn_with_kvcache
define it: append the (rotated) new keys and values into the cache, rotate q, then attend
with reference.attention (the project's fp64 reference) over each sequence's first
cache_seqlens[b] + seqlen_new keys, aligned bottom-right. Inputs are numpy arrays (or
anything np.asarray takes)."""
import numpy as np

import reference


def rotate(x, cos, sin, positions, interleaved):
    """x [tokens, heads, d] rotated in its first 2 * cos.shape[1] dims at `positions`."""
    x = np.array(x, dtype=np.float64)
    half = cos.shape[1]
    c = np.asarray(cos, dtype=np.float64)[positions][:, None, :]
    s = np.asarray(sin, dtype=np.float64)[positions][:, None, :]
    if interleaved:  # GPT-J: pairs (2i, 2i + 1)
        x1, x2 = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = x1 * c - x2 * s, x1 * s + x2 * c
    else:  # GPT-NeoX: pairs (i, i + half)
        x1, x2 = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half], x[..., half:2 * half] = x1 * c - x2 * s, x1 * s + x2 * c
    return x


def kvcache_attention(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None, rotary_cos=None, rotary_sin=None,
                      rotary_interleaved=False, cache_batch_idx=None, block_table=None, causal=False, window=None,
                      scale=None, softcap=0.0, alibi_slopes=None, alibi_symmetric=True):
    """Returns (o [b, sq, hq, dv], lse [b, hq, sq], k_cache, v_cache after the append), fp64.
    Paged caches are [pages, page_size, heads_kv, d] with block_table [b, pages per seq]."""
    q = np.asarray(q, dtype=np.float64)
    kc, vc = np.array(k_cache, dtype=np.float64), np.array(v_cache, dtype=np.float64)
    lens = [int(x) for x in np.asarray(cache_seqlens)]
    batch, sq = q.shape[:2]
    sn = 0 if k is None else np.asarray(k).shape[1]
    band = causal or (window is not None and any(w is not None and w >= 0 for w in window))
    qs, ks, vs, cu_k = [], [], [], [0]
    for b in range(batch):
        n = lens[b] + sn
        if block_table is not None:
            page = kc.shape[1]
            slots = [(int(np.asarray(block_table)[b, j // page]), j % page) for j in range(n)]
        else:
            row = b if cache_batch_idx is None else int(np.asarray(cache_batch_idx)[b])
            slots = [(row, j) for j in range(n)]
        qb = q[b]
        if sn:
            kn, vn = np.asarray(k, dtype=np.float64)[b], np.asarray(v, dtype=np.float64)[b]
            if rotary_cos is not None:
                kn = rotate(kn, rotary_cos, rotary_sin, lens[b] + np.arange(sn), rotary_interleaved)
            for t in range(sn):
                kc[slots[lens[b] + t]] = kn[t]
                vc[slots[lens[b] + t]] = vn[t]
        if rotary_cos is not None:
            pos = lens[b] + (np.arange(sq) if band else np.zeros(sq, dtype=int))
            qb = rotate(qb, rotary_cos, rotary_sin, pos, rotary_interleaved)
        qs.append(qb)
        ks.append(np.stack([kc[s] for s in slots]) if n else np.zeros((0,) + kc.shape[2:]))
        vs.append(np.stack([vc[s] for s in slots]) if n else np.zeros((0,) + vc.shape[2:]))
        cu_k.append(cu_k[-1] + n)
    cu_q = np.arange(batch + 1) * sq
    r = reference.attention(np.concatenate(qs), np.concatenate(ks), np.concatenate(vs), causal=causal,
                            window=window, align="bottom_right", scale=scale, softcap=softcap,
                            alibi_slopes=alibi_slopes, alibi_symmetric=alibi_symmetric, cu_seqlens_q=cu_q,
                            cu_seqlens_k=cu_k)
    o = r["o"].reshape(batch, sq, q.shape[2], -1)
    lse = r["lse"].reshape(q.shape[2], batch, sq).transpose(1, 0, 2)
    return o, lse, kc, vc
