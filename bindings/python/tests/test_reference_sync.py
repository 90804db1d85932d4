"""The Python fp64 reference (reference/reference.py) agrees with the C++ one (reference/
reference.cpp, run as tests/reference_dump.cpp) on configurations covering every option,
so the two references cannot drift apart. Both compute in double: they must agree to
rounding (1e-12 relative to the largest element), -inf LSE rows exactly."""
import os
import subprocess
import zlib

import numpy as np
import pytest

import reference as ref

DUMP = os.environ.get("FLASHATTN_REFERENCE_DUMP")
pytestmark = pytest.mark.skipif(not DUMP, reason="FLASHATTN_REFERENCE_DUMP (the fa_reference_dump program) is not set; "
                                "CTest's bindings.python sets it")


def _f32(p):
    """The dropout probability as the library receives it (a C float)."""
    return float(np.float32(p))


def _bcast_flags(shape, full):
    """The C++ reference's broadcast flags of a 4-d bias of `shape` against the `full` shape."""
    return [int(n == 1 and f != 1) for n, f in zip(shape, full)]


def run_cpp(q, k, v, do, *, lens_q, lens_k, scale, causal=False, window=None, align="top_left", softcap=0.0,
            bias=None, alibi_slopes=None, alibi_symmetric=False, dropout_p=0.0, seed=0, offset=0, layout=None):
    """reference_fp64 on packed-token inputs ([tokens, heads, dim]); returns its outputs by name."""
    batch, hq, hkv = len(lens_q), q.shape[-2], k.shape[-2]
    max_sq, max_sk = max(lens_q), max(lens_k)
    cu_q, cu_k = np.concatenate([[0], np.cumsum(lens_q)]), np.concatenate([[0], np.cumsum(lens_k)])
    full = (batch, hq, max_sq, max_sk)
    words = [batch, hq, hkv, q.shape[-1], v.shape[-1], max_sq, max_sk]

    def lst(x):
        x = np.asarray(x).ravel()
        words.append(x.size)
        words.extend(x.tolist())

    lst(cu_q)
    lst(cu_k)
    words += [repr(float(scale)), repr(float(softcap))]
    left, right = window if window is not None else (-1, -1)
    words += [int(causal or window is not None), int(align == "bottom_right"), left, 0 if causal else right]
    if bias is not None:
        words += [1] + _bcast_flags(bias.shape, full)
        lst(np.broadcast_to(bias, full))
    else:
        words += [3 if alibi_symmetric else 2 if alibi_slopes is not None else 0, 0, 0, 0, 0]
        lst([])
    lst(alibi_slopes if alibi_slopes is not None else [])
    words += [repr(_f32(dropout_p)), seed, offset]
    if layout is not None:
        lay, bq, bk = layout
        lst(lay)
        words += list(lay.shape) + [bq, bk]
    else:
        lst([])
        words += [1, 0, 0, 1, 1]
    words.append(int(do is not None))
    for x in (q, k, v, do if do is not None else np.zeros(0)):
        lst(x)
    text = " ".join(str(w) if not isinstance(w, float) else repr(w) for w in words)
    res = subprocess.run([DUMP], input=text, capture_output=True, text=True, check=True)
    out = {}
    for line in res.stdout.splitlines():
        name, n, *vals = line.split()
        out[name] = np.array([float(x) for x in vals], dtype=np.float64)
        assert out[name].size == int(n), name
    return out


def assert_close(name, got, want):
    """got: Python reference, want: C++ reference (flat, same element order)."""
    got, want = np.asarray(got, dtype=np.float64).ravel(), np.asarray(want).ravel()
    assert got.shape == want.shape, (name, got.shape, want.shape)
    inf = ~np.isfinite(want)
    assert np.array_equal(got[inf], want[inf]), "%s: non-finite entries differ" % name
    fin = ~inf
    if fin.any():
        scale = max(1.0, np.abs(want[fin]).max())
        err = np.abs(got[fin] - want[fin]).max() / scale
        assert err <= 1e-12, "%s: max relative difference %.3g" % (name, err)


CASES = {
    "dense": dict(),
    "gqa, dv != d, scale": dict(hq=6, hkv=2, dv=5, scale=0.3),
    "causal top-left, sq > sk": dict(sq=9, sk=6, causal=True),
    "causal bottom-right, sq > sk (masked rows)": dict(sq=9, sk=6, causal=True, align="bottom_right"),
    "window bottom-right, sq < sk": dict(sq=5, sk=11, window=(3, 1), align="bottom_right"),
    "softcap": dict(softcap=2.5),
    "bias tensor": dict(bias="bhqk"),
    "bias broadcast over batch and heads": dict(bias="qk"),
    "bias broadcast over heads and keys": dict(bias="bq"),
    "alibi": dict(alibi="plain"),
    "alibi symmetric, bottom-right": dict(alibi="symmetric", align="bottom_right"),
    "alibi per (batch, head)": dict(alibi="plain", alibi_batch=True),
    "alibi symmetric per (batch, head), causal bottom-right": dict(alibi="symmetric", alibi_batch=True, causal=True,
                                                                  align="bottom_right"),
    "dropout": dict(dropout_p=0.25, seed=0x1234567, offset=3),
    "block-sparse per head": dict(layout=(4, 3, 2)),
    "block-sparse shared, causal": dict(layout=(1, 2, 3), causal=True),
    "everything": dict(hq=4, hkv=2, causal=True, softcap=3.0, bias="hqk", dropout_p=0.125, seed=9,
                       layout=(4, 3, 3)),
}


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
@pytest.mark.parametrize("name", list(CASES))
def test_python_reference_matches_cpp(name, varlen):
    c = {**dict(b=2, sq=7, sk=8, hq=4, hkv=4, d=6, dv=None, scale=None), **CASES[name]}
    rng = np.random.default_rng(zlib.crc32(name.encode()) + varlen)
    b, sq, sk, hq, hkv, d = c["b"], c["sq"], c["sk"], c["hq"], c["hkv"], c["d"]
    dv = c["dv"] or d
    scale = c["scale"] or 1.0 / np.sqrt(d)
    if varlen:  # three sequences, one without queries, one without keys
        lens_q, lens_k = [sq, 0, max(1, sq - 3)], [sk, 2, 0]
        b = 3
    else:
        lens_q, lens_k = [sq] * b, [sk] * b
    tq, tk = sum(lens_q), sum(lens_k)
    q, do = rng.standard_normal((tq, hq, d)), rng.standard_normal((tq, hq, dv))
    k, v = rng.standard_normal((tk, hkv, d)), rng.standard_normal((tk, hkv, dv))
    opts = dict(scale=scale, causal=c.get("causal", False), window=c.get("window"), align=c.get("align", "top_left"),
                softcap=c.get("softcap", 0.0), dropout_p=_f32(c.get("dropout_p", 0.0)), seed=c.get("seed", 0),
                offset=c.get("offset", 0))
    if "bias" in c:  # the dimensions (of b, h, q, k) the bias has; the others broadcast
        full = (b, hq, max(lens_q), max(lens_k))
        opts["bias"] = rng.standard_normal(tuple(n if dim in c["bias"] else 1 for n, dim in zip(full, "bhqk")))
    if "alibi" in c:
        per_head = 2.0 ** -np.arange(1, hq + 1)
        opts["alibi_slopes"] = per_head * (1.0 + np.arange(b))[:, None] if c.get("alibi_batch") else per_head
        opts["alibi_symmetric"] = c["alibi"] == "symmetric"
    if "layout" in c:
        lh, bq, bk = c["layout"]
        nr, nc = -(-max(lens_q) // bq), -(-max(lens_k) // bk)
        opts["layout"] = ((rng.random((lh, nr, nc)) < 0.6).astype(np.uint8), bq, bk)
    want = run_cpp(q, k, v, do, lens_q=lens_q, lens_k=lens_k, **opts)

    if varlen:
        cu_q, cu_k = np.concatenate([[0], np.cumsum(lens_q)]), np.concatenate([[0], np.cumsum(lens_k)])
        got = ref.attention(q, k, v, do, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **opts)
        lse = got["lse"].T  # [hq, tq] -> [tq, hq]
    else:
        shp = lambda x: x.reshape(b, -1, *x.shape[1:])  # noqa: E731 (tokens -> [b, s, ...])
        got = ref.attention(shp(q), shp(k), shp(v), shp(do), **opts)
        lse = got["lse"].transpose(0, 2, 1)  # [b, hq, sq] -> [b, sq, hq]
    assert_close("o", got["o"], want["o"])
    assert_close("lse", lse, want["lse"])
    for g in ("dq", "dk", "dv"):
        assert_close(g, got[g], want[g])
    if "bias" in opts:
        full = (b, hq, max(lens_q), max(lens_k))
        summed = ref.reduce_like(got["dbias"], opts["bias"].shape)
        assert_close("dbias", np.broadcast_to(summed, full), want["dbias"])


def test_a_drifted_reference_is_caught():
    """Control: a reference that differs in one place fails the comparison."""
    rng = np.random.default_rng(1)
    q, k, v, do = (rng.standard_normal((5, 2, 4)) for _ in range(4))
    want = run_cpp(q, k, v, do, lens_q=[5], lens_k=[5], scale=0.5)
    got = ref.attention(q[None], k[None], v[None], do[None], scale=0.5 * (1 + 1e-9))
    with pytest.raises(AssertionError):
        assert_close("o", got["o"], want["o"])
