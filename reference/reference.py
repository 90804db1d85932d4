"""fp64 numpy reference of the attention semantics in flashattn.h (forward and backward).

The project's one Python fp64 reference, used by the Python binding's tests and by the
benchmark's --verify (bench/bench.py). It is the Python twin of the C++ reference beside it
(reference.cpp, used by the Catch2 tests and `flashattn check`): Python could reach that
one only through a new exported ABI, so this one is written in numpy (its own
Philox4x32-10 included) and bindings/python/tests/test_reference_sync.py holds it to the
C++ one on a set of configurations covering every option, so the two cannot drift.
docs/internals/references.md says why there are two.

Covers what the binding's tests use: dense [b, s, h, d] and varlen (cu_seqlens; empty
query or key sequences) inputs, GQA/MQA, head_dim_v != head_dim, band masks (causal,
window) in both alignments (per sequence in varlen mode), block-sparse layouts (one or
per-head), softcap, a bias tensor broadcastable to [b, hq, sq, sk] (in varlen mode sq/sk
are the longest sequence lengths) with dbias before the broadcast sums (reduce_like sums
it), ALiBi (both kinds; slopes [hq] or [b, hq]), dropout, fully masked rows (O = 0, LSE = -inf, zero gradients).
"""
import numpy as np

M32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Vectorized Philox4x32-10; all arguments uint64 arrays holding 32-bit values."""
    c0, c1, c2, c3 = (np.asarray(x, dtype=np.uint64) & M32 for x in (c0, c1, c2, c3))
    k0 = np.uint64(k0) & M32
    k1 = np.uint64(k1) & M32
    m0, m1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    w0, w1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
    for _ in range(10):
        p0 = m0 * c0
        p1 = m1 * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & M32
        hi1, lo1 = p1 >> np.uint64(32), p1 & M32
        c0, c1, c2, c3 = (hi1 ^ c1 ^ k0) & M32, lo1, (hi0 ^ c3 ^ k1) & M32, lo0
        k0 = (k0 + w0) & M32
        k1 = (k1 + w1) & M32
    return c0, c1, c2, c3


def dropout_threshold(p):
    """The 16-bit keep threshold t = min(floor(p * 65536 + 1/2), 65535) of drop probability p."""
    return min(int(np.floor(np.float64(np.float32(p)) * 65536.0 + 0.5)), 65535)


def dropout_scale(p):
    """The multiplier of kept values, 65536 / (65536 - t): the reciprocal of the keep probability."""
    return 65536.0 / (65536.0 - dropout_threshold(p))


def dropout_active(p):
    """Whether drop probability p drops anything: its threshold is above 0 (p >= 2^-17); below,
    every element is kept and scaled by 1, and the result is the p = 0 result."""
    return dropout_threshold(p) != 0


def dropout_keep(p, seed, offset, b, heads_q, h, sq, sk):
    """Boolean keep mask [sq, sk] of sequence b, query head h, per the header's contract."""
    thr = np.uint64(dropout_threshold(p))
    hc = (int(offset) + b * heads_q + h) & (2**64 - 1)
    i = np.arange(sq, dtype=np.uint64)[:, None]
    j = np.arange(sk, dtype=np.uint64)[None, :]
    jd8 = j // np.uint64(8)
    ii, jj = np.broadcast_arrays(i, jd8)
    words = philox4x32_10(jj, ii, np.full(ii.shape, hc & 0xFFFFFFFF, np.uint64),
                          np.full(ii.shape, hc >> 32, np.uint64), seed & 0xFFFFFFFF, seed >> 32)
    c = np.broadcast_to(j % np.uint64(8), ii.shape)
    word = np.choose((c // np.uint64(2)).astype(np.int64), words)
    r = (word >> (np.uint64(16) * (c % np.uint64(2)))) & np.uint64(0xFFFF)
    return r >= thr


def _masks(sq, sk, causal, window, align, layout, h):
    shift = sk - sq if align == "bottom_right" else 0
    i = np.arange(sq)[:, None] + shift
    j = np.arange(sk)[None, :]
    keep = np.ones((sq, sk), dtype=bool)
    left, right = window if window is not None else (None, None)
    if causal:
        right = 0
    if right is not None and right >= 0:
        keep &= j <= i + right
    if left is not None and left >= 0:
        keep &= j >= i - left
    if layout is not None:
        lay, bq, bk = layout
        lay = np.asarray(lay)
        if lay.ndim == 2:
            lay = lay[None]
        lh = lay[0 if lay.shape[0] == 1 else h]
        keep &= lh[np.arange(sq)[:, None] // bq, np.arange(sk)[None, :] // bk] != 0
    return keep, i


def _one_head(q, k, v, do, *, scale, softcap, bias, slope, alibi_sym, keep_mask, drop_keep, p, ip):
    """One (sequence, head): q [sq, d], k [sk, d], v [sk, dv]. Returns o, lse, dq, dk, dv, dbias."""
    s = scale * (q @ k.T)
    t = softcap * np.tanh(s / softcap) if softcap else s
    z = t.copy()
    if bias is not None:
        z = z + bias
    if slope is not None:
        jj = np.arange(k.shape[0])[None, :]
        z = z + (-slope * np.abs(ip - jj) if alibi_sym else slope * (jj - ip))
    z = np.where(keep_mask, z, -np.inf)
    m = z.max(axis=1, keepdims=True, initial=-np.inf)  # a row with no key at all is fully masked
    full = np.isneginf(m[:, 0])
    m = np.where(np.isneginf(m), 0.0, m)
    e = np.where(keep_mask, np.exp(z - m), 0.0)
    l = e.sum(axis=1, keepdims=True)
    P = np.where(l > 0, e / np.where(l > 0, l, 1.0), 0.0)
    lse = np.where(full, -np.inf, (m + np.log(np.where(l > 0, l, 1.0)))[:, 0])
    D = drop_keep * dropout_scale(p) if drop_keep is not None else 1.0
    Pd = P * D
    o = Pd @ v
    if do is None:
        return o, lse, None
    dv = Pd.T @ do
    dPd = do @ v.T
    dP = dPd * D
    dz = P * (dP - (dP * P).sum(axis=1, keepdims=True))
    ds = dz * (1.0 - np.tanh(s / softcap) ** 2) if softcap else dz
    dq = scale * ds @ k
    dk = scale * ds.T @ q
    return o, lse, (dq, dk, dv, dz)


def attention(q, k, v, do=None, *, causal=False, window=None, align="top_left", scale=None, softcap=0.0,
              bias=None, alibi_slopes=None, alibi_symmetric=False, dropout_p=0.0, seed=0, offset=0,
              layout=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Reference attention. Dense: q [b, sq, hq, d], k/v [b, sk, hkv, d]; varlen: q [tq, hq, d]
    with cu_seqlens. bias broadcastable to [b, hq, sq, sk]; alibi_slopes [hq] or [b, hq]. Returns dict with o, lse and,
    when do is given, dq, dk, dv, dbias (full [b, hq, sq, sk] before broadcast sums)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if do is not None:
        do = np.asarray(do, dtype=np.float64)
    varlen = cu_seqlens_q is not None
    if varlen:
        cq, ck = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
        batch = len(cq) - 1
        hq, hkv = q.shape[1], k.shape[1]
        spans = [((cq[b], cq[b + 1]), (ck[b], ck[b + 1])) for b in range(batch)]
        max_sq = int(np.diff(cq).max())
        max_sk = int(np.diff(ck).max())
    else:
        batch, sq_, hq = q.shape[:3]
        sk_, hkv = k.shape[1], k.shape[2]
        max_sq, max_sk = sq_, sk_
        spans = [((0, sq_), (0, sk_))] * batch
    d = q.shape[-1]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    group = hq // hkv
    o = np.zeros(q.shape[:-1] + (v.shape[-1],))
    lse = np.zeros((hq, q.shape[0]) if varlen else (batch, hq, q.shape[1]))
    grads = None
    if do is not None:
        grads = dict(dq=np.zeros_like(q), dk=np.zeros_like(k), dv=np.zeros_like(v),
                     dbias=np.zeros((batch, hq, max_sq, max_sk)))
    slopes = None if alibi_slopes is None else np.asarray(alibi_slopes, dtype=np.float64)  # [hq] or [b, hq]
    if bias is not None:
        bias = np.asarray(bias, dtype=np.float64)
        bias = np.broadcast_to(bias.reshape((1,) * (4 - bias.ndim) + bias.shape), (batch, hq, max_sq, max_sk))
    for b in range(batch):
        (q0, q1), (k0, k1) = spans[b]
        sq, sk = q1 - q0, k1 - k0
        for h in range(hq):
            hk = h // group
            if varlen:
                qs, ks, vs = q[q0:q1, h], k[k0:k1, hk], v[k0:k1, hk]
                dos = do[q0:q1, h] if do is not None else None
            else:
                qs, ks, vs = q[b, :, h], k[b, :, hk], v[b, :, hk]
                dos = do[b, :, h] if do is not None else None
            if sq == 0:
                continue
            keep_mask, ip = _masks(sq, sk, causal, window, align, layout, h)
            drop = dropout_keep(dropout_p, seed, offset, b, hq, h, sq, sk) if dropout_active(dropout_p) else None
            res = _one_head(qs, ks, vs, dos, scale=scale, softcap=softcap,
                            bias=bias[b, h, :sq, :sk] if bias is not None else None,
                            slope=None if slopes is None else float(slopes[h] if slopes.ndim == 1 else slopes[b, h]),
                            alibi_sym=alibi_symmetric, keep_mask=keep_mask, drop_keep=drop, p=dropout_p, ip=ip)
            oo, ll, gg = res
            if varlen:
                o[q0:q1, h] = oo
                lse[h, q0:q1] = ll
            else:
                o[b, :, h] = oo
                lse[b, h] = ll
            if gg is not None:
                dq, dk, dv, dz = gg
                if varlen:
                    grads["dq"][q0:q1, h] = dq
                    grads["dk"][k0:k1, hk] += dk
                    grads["dv"][k0:k1, hk] += dv
                else:
                    grads["dq"][b, :, h] = dq
                    grads["dk"][b, :, hk] += dk
                    grads["dv"][b, :, hk] += dv
                grads["dbias"][b, h, :sq, :sk] = dz
    out = dict(o=o, lse=lse)
    if grads:
        out.update(grads)
    return out


def reduce_like(full, shape):
    """Sum a [b, h, sq, sk] gradient over the dims where `shape` (broadcast bias) has size 1."""
    shape = (1,) * (4 - len(shape)) + tuple(shape)
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and full.shape[i] != 1)
    return full.sum(axis=axes, keepdims=True)
