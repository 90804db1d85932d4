"""Backward pass on the CPU backend: against the analytic fp64 reference, and against
central finite differences of the library's own forward."""
import numpy as np
import pytest

import flashattn
import reference as ref

RNG = np.random.default_rng(77)


def rand(*shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def close(a, b, tol):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    err = np.abs(a - b).max(initial=0.0)
    assert err <= tol, "max abs error %g > %g" % (err, tol)


def run(q, k, v, do, **opts):
    out, lse = flashattn.forward(q, k, v, return_lse=True, **opts)
    grads = flashattn.backward(q, k, v, out, lse, do, **opts)
    return out, lse, grads


@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (3, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_matches_reference(hq, hkv, causal):
    q, k, v = rand(2, 23, hq, 16), rand(2, 31, hkv, 16), rand(2, 31, hkv, 12)
    do = rand(2, 23, hq, 12)
    out, lse, (dq, dk, dv) = run(q, k, v, do, causal=causal, align="bottom_right")
    r = ref.attention(q, k, v, do, causal=causal, align="bottom_right")
    close(out, r["o"], 2e-5)
    close(dq, r["dq"], 1e-4)
    close(dk, r["dk"], 1e-4)
    close(dv, r["dv"], 1e-4)


def test_plan_backward_with_dbias_broadcast():
    b, sq, sk, h = 2, 10, 13, 3
    q, k, v, do = rand(b, sq, h, 8), rand(b, sk, h, 8), rand(b, sk, h, 8), rand(b, sq, h, 8)
    bias = rand(1, h, sq, sk)  # broadcast over batch
    plan = flashattn.Plan(b, sq, sk, h, h, 8, dtype="fp32", backend="cpu")
    plan.set_bias("tensor", (0, sq * sk, sk, 1)).set_softcap(3.0)
    out, lse = plan.forward(q, k, v, bias=bias)
    dq, dk, dv, dbias = plan.backward(q, k, v, out, lse, do, bias=bias, dbias=True)
    r = ref.attention(q, k, v, do, bias=bias, softcap=3.0)
    close(out, r["o"], 2e-5)
    close(dq, r["dq"], 1e-4)
    close(dk, r["dk"], 1e-4)
    close(dv, r["dv"], 1e-4)
    assert dbias.shape == (1, h, sq, sk)
    close(dbias, ref.reduce_like(r["dbias"], bias.shape), 1e-4)


def test_convenience_backward_dbias_2d():
    q, k, v, do = rand(2, 6, 2, 8), rand(2, 9, 2, 8), rand(2, 9, 2, 8), rand(2, 6, 2, 8)
    bias = rand(6, 9)
    out, lse = flashattn.forward(q, k, v, bias=bias, return_lse=True)
    dq, dk, dv, dbias = flashattn.backward(q, k, v, out, lse, do, bias=bias, want_dbias=True)
    r = ref.attention(q, k, v, do, bias=bias)
    assert dbias.shape == (6, 9)
    close(dbias, ref.reduce_like(r["dbias"], bias.shape).reshape(6, 9), 1e-4)
    close(dq, r["dq"], 1e-4)


def test_backward_dropout_uses_forward_mask():
    q, k, v, do = rand(1, 15, 2, 8), rand(1, 21, 2, 8), rand(1, 21, 2, 8), rand(1, 15, 2, 8)
    opts = dict(dropout_p=0.3, seed=1234, offset=10, causal=True)
    out, lse, (dq, dk, dv) = run(q, k, v, do, **opts)
    r = ref.attention(q, k, v, do, **opts)
    close(out, r["o"], 2e-5)
    close(dq, r["dq"], 1e-4)
    close(dk, r["dk"], 1e-4)
    close(dv, r["dv"], 1e-4)


def test_backward_varlen_alibi_window():
    cu_q = np.array([0, 7, 7, 19], dtype=np.int32)
    cu_k = np.array([0, 5, 14, 26], dtype=np.int32)
    q, k, v, do = rand(19, 4, 8), rand(26, 2, 8), rand(26, 2, 8), rand(19, 4, 8)
    slopes = np.array([0.5, 0.25, 0.125, 0.0625], dtype=np.float32)
    opts = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, alibi_slopes=slopes, window=(6, 2))
    _check_backward(q, k, v, do, opts)
    opts["alibi_slopes"] = slopes * np.array([[1.0], [0.3], [2.5]], np.float32)  # per (sequence, head)
    _check_backward(q, k, v, do, opts)


def _check_backward(q, k, v, do, opts):
    out, lse, (dq, dk, dv) = run(q, k, v, do, **opts)
    r = ref.attention(q, k, v, do, **opts)
    close(out, r["o"], 2e-5)
    close(lse, r["lse"], 2e-5)
    close(dq, r["dq"], 1e-4)
    close(dk, r["dk"], 1e-4)
    close(dv, r["dv"], 1e-4)


def test_backward_block_sparse_fully_masked_rows_get_zero_grads():
    q, k, v, do = rand(1, 16, 1, 8), rand(1, 16, 1, 8), rand(1, 16, 1, 8), rand(1, 16, 1, 8)
    lay = np.array([[1, 0], [0, 0]], dtype=np.uint8)  # rows 8..15 see no key
    out, lse, (dq, dk, dv) = run(q, k, v, do, block_sparse=(lay, 8, 8))
    assert np.all(out[0, 8:] == 0) and np.all(np.isneginf(lse[0, 0, 8:]))
    assert np.all(dq[0, 8:] == 0)
    r = ref.attention(q, k, v, do, layout=(lay, 8, 8))
    close(dq, r["dq"], 1e-4)
    close(dk, r["dk"], 1e-4)
    close(dv, r["dv"], 1e-4)


def test_backward_against_finite_differences_of_the_library():
    """d/dx sum(O * G) by central differences of flashattn.forward (fp32), at sampled entries."""
    q, k, v = rand(1, 7, 2, 4), rand(1, 9, 1, 4), rand(1, 9, 1, 4)
    g = rand(1, 7, 2, 4)
    opts = dict(causal=True, align="bottom_right", softcap=4.0)
    out, lse = flashattn.forward(q, k, v, return_lse=True, **opts)
    dq, dk, dv = flashattn.backward(q, k, v, out, lse, g, **opts)
    eps = 1e-2

    def loss(q_, k_, v_):
        return float((flashattn.forward(q_, k_, v_, **opts).astype(np.float64) * g).sum())

    for name, arr, grad in (("q", q, dq), ("k", k, dk), ("v", v, dv)):
        for idx in list(np.ndindex(arr.shape))[::5]:
            plus, minus = arr.copy(), arr.copy()
            plus[idx] += eps
            minus[idx] -= eps
            args_p = {"q": q, "k": k, "v": v, name: plus}
            args_m = {"q": q, "k": k, "v": v, name: minus}
            num = (loss(**{a + "_": x for a, x in args_p.items()}) - loss(**{a + "_": x for a, x in args_m.items()}))
            num /= 2 * eps
            assert abs(num - grad[idx]) < 2e-3 + 2e-2 * abs(num), (name, idx, num, grad[idx])


def test_reference_backward_against_finite_differences():
    """The analytic reference gradient is itself checked numerically (fp64)."""
    q, k, v = (rand(1, 5, 2, 3).astype(np.float64) for _ in range(3))
    g = rand(1, 5, 2, 3).astype(np.float64)
    bias = rand(1, 2, 5, 5).astype(np.float64)
    opts = dict(causal=True, softcap=2.0, bias=bias)
    r = ref.attention(q, k, v, g, **opts)
    eps = 1e-6
    for name, arr in (("q", q), ("k", k), ("v", v)):
        for idx in np.ndindex(arr.shape):
            p, m = arr.copy(), arr.copy()
            p[idx] += eps
            m[idx] -= eps
            kw_p = {"q": q, "k": k, "v": v, name: p}
            kw_m = {"q": q, "k": k, "v": v, name: m}
            num = ((ref.attention(**kw_p, **opts)["o"] - ref.attention(**kw_m, **opts)["o"]) * g).sum() / (2 * eps)
            assert abs(num - r["d" + name][idx]) < 1e-6


def test_fp16_backward():
    q, k, v, do = (rand(1, 24, 2, 32, dtype=np.float16) for _ in range(4))
    out, lse, (dq, dk, dv) = run(q, k, v, do, causal=True)
    assert dq.dtype == np.float16
    r = ref.attention(q, k, v, do, causal=True)
    close(dq, r["dq"], 2e-2)
    close(dk, r["dk"], 2e-2)
    close(dv, r["dv"], 2e-2)


def test_deterministic_backward_is_bitwise_stable():
    q, k, v, do = rand(2, 33, 4, 16), rand(2, 33, 2, 16), rand(2, 33, 2, 16), rand(2, 33, 4, 16)
    a = run(q, k, v, do, deterministic=True)[2]
    b = run(q, k, v, do, deterministic=True)[2]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("algorithm", ["flash", "standard"])
def test_grad_accumulate_adds_to_the_given_gradients(dtype, algorithm):
    """set_grad_accumulate: dX = round(float(dX) + gradient); fp32 is bitwise the fp32 sum
    of the start value and the plain run's gradient, fp16 within one rounding of it, and
    both against the fp64 reference."""
    b, sq, sk, hq, hkv, d = 2, 19, 27, 4, 2, 24
    q, k, v, do = rand(b, sq, hq, d, dtype=dtype), rand(b, sk, hkv, d, dtype=dtype), \
        rand(b, sk, hkv, d, dtype=dtype), rand(b, sq, hq, d, dtype=dtype)
    plan = flashattn.Plan(b, sq, sk, hq, hkv, d, dtype="fp32" if dtype == np.float32 else "fp16", backend="cpu")
    plan.configure(causal=True, align="bottom_right", softcap=5.0, algorithm=algorithm)
    out, lse = plan.forward(q, k, v)
    plain = plan.backward(q, k, v, out, lse, do)
    starts = [rand(*g.shape, dtype=dtype) for g in plain]
    acc = [s.copy() for s in starts]
    assert plan.configure(grad_accumulate=True) is plan
    got = plan.backward(q, k, v, out, lse, do, dq=acc[0], dk=acc[1], dv=acc[2])
    assert all(g is a for g, a in zip(got, acc))
    r = ref.attention(q, k, v, do, causal=True, align="bottom_right", softcap=5.0)
    for name, s, p, a in zip(("dq", "dk", "dv"), starts, plain, acc):
        s64, p64, a64 = (x.astype(np.float64) for x in (s, p, a))
        if dtype == np.float32:
            assert np.array_equal(a, s + p), name
        else:
            u = 2.0 ** -11
            assert np.all(np.abs(a64 - (s64 + p64)) <= u * np.abs(s64 + p64) + u * np.abs(p64) + 2.0 ** -24), name
        close(a64 - s64, r[name], 1e-4 if dtype == np.float32 else 5e-3)


def test_grad_accumulate_needs_the_gradients_and_refuses_dbias():
    q, k, v, do = rand(1, 8, 2, 8), rand(1, 8, 2, 8), rand(1, 8, 2, 8), rand(1, 8, 2, 8)
    plan = flashattn.Plan(1, 8, 8, 2, 2, 8, dtype="fp32", backend="cpu").set_grad_accumulate()
    out, lse = plan.forward(q, k, v)
    with pytest.raises(flashattn.FlashAttnError) as ei:
        plan.backward(q, k, v, out, lse, do, dk=np.zeros_like(k), dv=np.zeros_like(v))
    assert ei.value.status == flashattn.Status.NULL_POINTER and "dq is required" in ei.value.message
    bias = rand(1, 2, 8, 8)
    plan.set_bias("tensor", (128, 64, 8, 1))
    out, lse = plan.forward(q, k, v, bias=bias)
    dq, dk, dv = np.ones_like(q), np.ones_like(k), np.ones_like(v)
    with pytest.raises(flashattn.FlashAttnError) as ei:
        plan.backward(q, k, v, out, lse, do, dq=dq, dk=dk, dv=dv, bias=bias, dbias=True)
    assert ei.value.status == flashattn.Status.INCOMPATIBLE_OPTIONS and "args.dbias" in ei.value.message
    assert (dq == 1).all() and (dk == 1).all() and (dv == 1).all()
