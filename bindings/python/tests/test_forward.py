"""Forward pass on the CPU backend against the fp64 numpy reference."""
import numpy as np
import pytest

import flashattn
import reference as ref

RNG = np.random.default_rng(1234)


def rand(*shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def qkv(b, sq, sk, hq, hkv, d, dv=None, dtype=np.float32):
    dv = d if dv is None else dv
    return rand(b, sq, hq, d, dtype=dtype), rand(b, sk, hkv, d, dtype=dtype), rand(b, sk, hkv, dv, dtype=dtype)


def close(a, b, tol):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    both_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    with np.errstate(invalid="ignore"):
        err = np.where(both_inf, 0.0, np.abs(a - b))
    assert not np.isnan(err).any(), "NaN in comparison"
    assert err.max(initial=0.0) <= tol, "max abs error %g > %g" % (err.max(), tol)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_reference(hq, hkv, causal):
    q, k, v = qkv(2, 37, 53, hq, hkv, 32, 24)
    out, lse = flashattn.forward(q, k, v, causal=causal, return_lse=True)
    r = ref.attention(q, k, v, causal=causal)
    assert out.shape == (2, 37, hq, 24) and out.dtype == np.float32
    assert lse.shape == (2, hq, 37) and lse.dtype == np.float32
    close(out, r["o"], 2e-5)
    close(lse, r["lse"], 2e-5)


def test_plan_api_explicit():
    q, k, v = qkv(1, 16, 16, 2, 2, 8)
    with flashattn.Plan(1, 16, 16, 2, 2, 8, dtype="fp32", backend="cpu") as plan:
        assert plan.backend == "cpu"
        assert plan.dtype == "fp32"
        plan.set_scale(0.3).set_mask(causal=True, align="bottom_right")
        out, lse = plan.forward(q, k, v)
        r = ref.attention(q, k, v, causal=True, align="bottom_right", scale=0.3)
        close(out, r["o"], 2e-5)
        close(lse, r["lse"], 2e-5)
        # Caller-provided outputs are written in place.
        o2 = np.full_like(out, np.nan)
        l2 = np.full_like(lse, np.nan)
        plan.forward(q, k, v, out=o2, lse=l2)
        np.testing.assert_array_equal(o2, out)
        np.testing.assert_array_equal(l2, lse)


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_causal_alignment_and_fully_masked_rows(align):
    # sq > sk with bottom-right alignment leaves the first sq - sk rows with no key.
    q, k, v = qkv(1, 20, 12, 2, 2, 16)
    out, lse = flashattn.forward(q, k, v, causal=True, align=align, return_lse=True)
    r = ref.attention(q, k, v, causal=True, align=align)
    close(out, r["o"], 2e-5)
    close(lse, r["lse"], 2e-5)
    if align == "bottom_right":
        assert np.all(out[0, :8] == 0)
        assert np.all(np.isneginf(lse[0, :, :8]))


def test_sliding_window_and_softcap():
    q, k, v = qkv(2, 40, 40, 2, 1, 16)
    out = flashattn.forward(q, k, v, window=(5, 3), softcap=2.5)
    close(out, ref.attention(q, k, v, window=(5, 3), softcap=2.5)["o"], 2e-5)
    out = flashattn.forward(q, k, v, causal=True, window=(7, None))
    close(out, ref.attention(q, k, v, causal=True, window=(7, None))["o"], 2e-5)


@pytest.mark.parametrize("bias_shape", [(2, 3, 9, 14), (1, 3, 9, 14), (9, 14), (2, 1, 1, 14)])
def test_bias_tensor_broadcast(bias_shape):
    q, k, v = qkv(2, 9, 14, 3, 3, 8)
    bias = rand(*bias_shape)
    out = flashattn.forward(q, k, v, bias=bias)
    close(out, ref.attention(q, k, v, bias=bias)["o"], 2e-5)


@pytest.mark.parametrize("symmetric", [False, True])
def test_alibi(symmetric):
    q, k, v = qkv(1, 11, 17, 4, 2, 8)
    slopes = (2.0 ** -np.arange(1, 5)).astype(np.float32)
    out = flashattn.forward(q, k, v, alibi_slopes=slopes, alibi_symmetric=symmetric, causal=True,
                            align="bottom_right")
    r = ref.attention(q, k, v, alibi_slopes=slopes, alibi_symmetric=symmetric, causal=True, align="bottom_right")
    close(out, r["o"], 2e-5)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("form", ["packed", "strided rows", "broadcast rows"])
def test_alibi_per_batch_and_head(symmetric, form):
    q, k, v = qkv(3, 11, 17, 4, 2, 8)
    per_head = (2.0 ** -np.arange(1, 5)).astype(np.float32)
    if form == "packed":
        slopes = per_head * np.array([[1.0], [2.0], [0.5]], np.float32)
    elif form == "strided rows":  # rows 6 floats apart
        slopes = np.full((3, 6), np.nan, np.float32)
        slopes[:, :4] = per_head * np.array([[0.7], [1.9], [3.0]], np.float32)
        slopes = slopes[:, :4]
    else:  # batch stride 0: the per-head form written as (batch, heads)
        slopes = np.broadcast_to(per_head, (3, 4))
    out = flashattn.forward(q, k, v, alibi_slopes=slopes, alibi_symmetric=symmetric, window=(5, 2),
                            align="bottom_right")
    r = ref.attention(q, k, v, alibi_slopes=slopes, alibi_symmetric=symmetric, window=(5, 2), align="bottom_right")
    close(out, r["o"], 2e-5)
    plain = ref.attention(q, k, v, alibi_slopes=per_head, alibi_symmetric=symmetric, window=(5, 2),
                          align="bottom_right")
    assert (form == "broadcast rows") == np.allclose(out, plain["o"], atol=2e-5)  # the rows made a difference


@pytest.mark.parametrize("heads", [1, 2])
def test_block_sparse(heads):
    q, k, v = qkv(1, 24, 30, 2, 2, 8)
    lay = (RNG.random((heads, 3, 4)) < 0.6).astype(np.uint8)
    lay[:, 0, 0] = 1
    out, lse = flashattn.forward(q, k, v, block_sparse=(lay, 8, 8), return_lse=True)
    r = ref.attention(q, k, v, layout=(lay, 8, 8))
    close(out, r["o"], 2e-5)
    close(lse, r["lse"], 2e-5)


def test_varlen_with_empty_sequence():
    cu_q = np.array([0, 5, 5, 17], dtype=np.int32)
    cu_k = np.array([0, 9, 12, 20], dtype=np.int32)
    q, k, v = rand(17, 4, 16), rand(20, 2, 16), rand(20, 2, 16)
    out, lse = flashattn.forward(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True,
                                 align="bottom_right", return_lse=True)
    r = ref.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True, align="bottom_right")
    assert out.shape == (17, 4, 16) and lse.shape == (4, 17)
    close(out, r["o"], 2e-5)
    close(lse, r["lse"], 2e-5)


def test_strided_inputs_and_bhsd_layout():
    # q, k, v as slices of a packed qkv array: non-contiguous seq/head strides.
    qkv_ = rand(2, 21, 3, 4, 16)
    q, k, v = qkv_[:, :, 0], qkv_[:, :, 1], qkv_[:, :, 2]
    assert not q.flags.c_contiguous
    out = flashattn.forward(q, k, v, causal=True)
    close(out, ref.attention(q, k, v, causal=True)["o"], 2e-5)
    # (batch, heads, seq, dim) arrays with layout='bhsd': output comes back in that layout.
    qt, kt, vt = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v))
    out_t = flashattn.forward(qt, kt, vt, causal=True, layout="bhsd")
    assert out_t.shape == (2, 4, 21, 16)
    close(out_t.transpose(0, 2, 1, 3), out, 1e-5)


def test_plan_strides_must_match():
    q, k, v = qkv(1, 8, 8, 2, 2, 8)
    qt = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # BHSD memory, BSHD view
    plan = flashattn.Plan(1, 8, 8, 2, 2, 8, dtype="fp32", backend="cpu")
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        plan.forward(qt, k, v)
    assert ei.value.status == flashattn.Status.INVALID_STRIDE
    assert "q" in ei.value.message
    plan.set_strides("q", [x // 4 for x in qt.strides])
    out, _ = plan.forward(qt, k, v)
    close(out, ref.attention(q, k, v)["o"], 2e-5)


def test_fp16():
    q, k, v = qkv(2, 33, 47, 4, 2, 64, dtype=np.float16)
    out, lse = flashattn.forward(q, k, v, causal=True, return_lse=True)
    assert out.dtype == np.float16
    r = ref.attention(q, k, v, causal=True)
    close(out, r["o"], 3e-3)
    close(lse, r["lse"], 1e-3)


def _to_bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def _from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def test_bf16_as_uint16_bits():
    q, k, v = qkv(1, 19, 23, 2, 2, 32)
    qb, kb, vb = (_to_bf16_bits(x) for x in (q, k, v))
    with pytest.raises(flashattn.FlashAttnError):
        flashattn.forward(qb, kb, vb)  # uint16 without dtype='bf16' is refused
    out = flashattn.forward(qb, kb, vb, dtype="bf16")
    assert out.dtype == np.uint16
    r = ref.attention(*(_from_bf16_bits(x) for x in (qb, kb, vb)))
    close(_from_bf16_bits(out), r["o"], 2e-2)


def test_bf16_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = (x.astype(ml_dtypes.bfloat16) for x in qkv(1, 9, 9, 2, 2, 16))
    out = flashattn.forward(q, k, v)
    assert out.dtype == ml_dtypes.bfloat16
    close(out.astype(np.float32), ref.attention(q.astype(np.float32), k.astype(np.float32),
                                                v.astype(np.float32))["o"], 2e-2)


def _dropout_probe(p, seed, offset, b=2, h=3, sq=40, sk=64):
    """Forward with V = identity, so O row i is exactly row i of the dropped probabilities."""
    q = rand(b, sq, h, 8, scale=0.3)
    k = rand(b, sk, h, 8, scale=0.3)
    v = np.broadcast_to(np.eye(sk, dtype=np.float32)[None, :, None, :], (b, sk, h, sk)).copy()
    out = flashattn.forward(q, k, v, dropout_p=p, seed=seed, offset=offset)
    return q, k, v, out


@pytest.mark.parametrize("p", [0.3, 0.99])
def test_dropout_keep_fraction_and_scaling(p):
    q, k, v, out = _dropout_probe(p, seed=42, offset=7)
    r = ref.attention(q, k, v)  # no dropout: probabilities P
    P = r["o"]
    kept = out != 0
    n = kept.size
    frac = kept.mean()
    # Binomial(n, 1-p): 6 standard deviations.
    assert abs(frac - (1 - p)) < 6 * np.sqrt(p * (1 - p) / n), frac
    # Kept values are P * 65536 / (65536 - t), t = round(p * 65536): at p = 0.99 that is
    # 65536 / 655 = 100.055, 5.5e-4 above 1 / (1 - p).
    t = round(p * 65536)
    np.testing.assert_allclose(out[kept], P[kept] * (65536 / (65536 - t)), rtol=1e-4, atol=1e-6)


def test_dropout_mask_is_the_documented_philox_stream():
    p, seed, offset = 0.25, 0x1234_5678_9ABC_DEF0, 2**32 + 5
    q, k, v, out = _dropout_probe(p, seed, offset, b=2, h=2, sq=13, sk=24)
    r = ref.attention(q, k, v, dropout_p=p, seed=seed, offset=offset)
    close(out, r["o"], 1e-5)
    # Same seed, same mask; another offset gives another mask.
    again = flashattn.forward(q, k, v, dropout_p=p, seed=seed, offset=offset)
    np.testing.assert_array_equal(again, out)
    other = flashattn.forward(q, k, v, dropout_p=p, seed=seed, offset=offset + 4)
    assert (other != 0).sum() != 0 and not np.array_equal(other != 0, out != 0)


def test_dropout_general_inputs_match_reference():
    q, k, v = qkv(2, 17, 29, 4, 2, 16)
    out = flashattn.forward(q, k, v, causal=True, dropout_p=0.2, seed=99, offset=3)
    close(out, ref.attention(q, k, v, causal=True, dropout_p=0.2, seed=99, offset=3)["o"], 3e-5)


@pytest.mark.parametrize("algorithm", ["flash", "standard"])
def test_algorithms_agree(algorithm):
    q, k, v = qkv(1, 30, 30, 2, 2, 16)
    out = flashattn.forward(q, k, v, causal=True, algorithm=algorithm)
    close(out, ref.attention(q, k, v, causal=True)["o"], 2e-5)


def test_workspace_query_and_explicit_workspace():
    q, k, v = qkv(1, 16, 16, 2, 2, 8)
    plan = flashattn.Plan(1, 16, 16, 2, 2, 8, dtype="fp32", backend="cpu", algorithm="standard")
    need = plan.workspace_size("forward")
    assert need >= 0
    ws = np.empty(need + 16, dtype=np.uint8)
    out, _ = plan.forward(q, k, v, workspace=ws)
    close(out, ref.attention(q, k, v)["o"], 2e-5)
    assert plan.workspace_size("backward") >= 0


def test_version_and_info():
    major, minor, patch = flashattn.version()
    assert major == flashattn.ABI_MAJOR and minor >= flashattn.ABI_MINOR
    assert isinstance(flashattn.has_cuda_backend(), bool)
    assert flashattn.cuda_device_count() >= 0


def test_plan_keywords_for_every_setter():
    """Every option as a constructor keyword gives the reference's result."""
    b, sq, sk, hq, hkv, d = 1, 12, 16, 2, 1, 8
    q, k, v = qkv(b, sq, sk, hq, hkv, d)
    qt = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # BHSD memory
    bias = rand(1, hq, sq, sk)
    lay = np.array([[1, 1], [0, 1]], dtype=np.uint8)
    plan = flashattn.Plan(b, sq, sk, hq, hkv, d, dtype="fp32", backend="cpu", scale=0.4, causal=True,
                          window=(5, None), align="bottom_right", softcap=3.0, bias="tensor",
                          bias_strides=(0, sq * sk, sk, 1), dropout_p=0.2, seed=7, offset=1,
                          block_sparse=(lay, 8, 8), deterministic=True, algorithm="flash",
                          strides={"q": [x // 4 for x in qt.strides]})
    out, lse = plan.forward(qt, k, v, bias=bias)
    r = ref.attention(q, k, v, scale=0.4, causal=True, window=(5, None), align="bottom_right", softcap=3.0,
                      bias=bias, dropout_p=0.2, seed=7, offset=1, layout=(lay, 8, 8))
    close(out, r["o"], 3e-5)
    close(lse, r["lse"], 3e-5)
    # varlen as a keyword too
    vplan = flashattn.Plan(2, 4, 4, 1, 1, 8, dtype="fp32", backend="cpu", varlen=(6, 7))
    assert vplan.varlen == (6, 7)
    vplan.set_varlen()
    assert vplan.varlen is None


def test_one_plan_many_threads():
    import threading
    q, k, v = qkv(2, 64, 64, 4, 2, 32)
    plan = flashattn.Plan(2, 64, 64, 4, 2, 32, dtype="fp32", backend="cpu", causal=True)
    expect, _ = plan.forward(q, k, v)
    results, errors = [], []

    def work():
        try:
            for _ in range(5):
                results.append(plan.forward(q, k, v)[0])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 20
    for r in results:
        np.testing.assert_array_equal(r, expect)
