"""torch integration: flashattn.attention (autograd) against
torch.nn.functional.scaled_dot_product_attention. The CPU cases need torch; the GPU cases
need torch with CUDA and a libflashattn built with CUDA. Both skip otherwise."""
import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402


def _sdpa(q, k, v, causal, bias=None):
    # SDPA takes (batch, heads, seq, dim); expand kv heads for GQA.
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    rep = qt.shape[1] // kt.shape[1]
    kt = kt.repeat_interleave(rep, dim=1)
    vt = vt.repeat_interleave(rep, dim=1)
    o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias, is_causal=causal)
    return o.transpose(1, 2)


def _compare(device, dtype, causal, hq, hkv, tol, with_bias=False):
    g = torch.Generator(device="cpu").manual_seed(0)
    b, s, d = 2, 67, 64
    mk = lambda *sh: torch.randn(*sh, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)  # noqa: E731
    q, k, v = mk(b, s, hq, d), mk(b, s, hkv, d), mk(b, s, hkv, d)
    bias = mk(1, hq, s, s) if with_bias else None
    do = mk(b, s, hq, d)
    leaves = [q, k, v] + ([bias] if with_bias else [])
    for t in leaves:
        t.requires_grad_(True)
    out = flashattn.attention(q, k, v, causal=causal, bias=bias)
    grads = torch.autograd.grad(out, leaves, do)
    ref_leaves = [t.detach().float().requires_grad_(True) for t in leaves]
    ref_out = _sdpa(*ref_leaves[:3], causal, ref_leaves[3] if with_bias else None)
    ref_grads = torch.autograd.grad(ref_out, ref_leaves, do.float())
    assert (out.float() - ref_out).abs().max().item() < tol
    for name, a, r in zip(("dq", "dk", "dv", "dbias"), grads, ref_grads):
        assert a.shape == r.shape, name
        err = (a.float() - r).abs().max().item()
        assert err < tol * max(1.0, r.abs().max().item()), (name, err)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2)])
def test_attention_cpu_matches_sdpa(causal, hq, hkv):
    _compare("cpu", torch.float32, causal, hq, hkv, 1e-4)


def test_attention_cpu_bias_grad():
    _compare("cpu", torch.float32, False, 2, 2, 1e-4, with_bias=True)


def test_attention_dropout_reproducible_with_manual_seed():
    q = torch.randn(1, 32, 2, 16, requires_grad=True)
    torch.manual_seed(3)
    a = flashattn.attention(q, q, q, dropout_p=0.5)
    torch.manual_seed(3)
    b = flashattn.attention(q, q, q, dropout_p=0.5)
    assert torch.equal(a, b)
    a.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def _cuda_ready():
    return torch.cuda.is_available() and flashattn.has_cuda_backend() and flashattn.cuda_device_count() > 0


gpu = pytest.mark.skipif(not _cuda_ready(), reason="needs torch with CUDA and a CUDA build of libflashattn")


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv", [(8, 8), (8, 2)])
def test_attention_gpu_matches_sdpa(dtype, causal, hq, hkv):
    _compare("cuda", dtype, causal, hq, hkv, 2e-2 if dtype == torch.float16 else 6e-2)


@gpu
def test_attention_gpu_on_a_side_stream():
    s = torch.cuda.Stream()
    q = torch.randn(2, 128, 4, 64, device="cuda", dtype=torch.float16)
    s.wait_stream(torch.cuda.current_stream())  # q is produced on the default stream
    with torch.cuda.stream(s):
        out = flashattn.attention(q, q, q, causal=True)
    s.synchronize()
    ref = _sdpa(q.float(), q.float(), q.float(), True)
    assert (out.float() - ref).abs().max().item() < 2e-2
