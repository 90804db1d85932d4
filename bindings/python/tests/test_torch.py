"""torch integration: flashattn.attention (autograd) against
torch.nn.functional.scaled_dot_product_attention. The CPU cases need torch; the GPU cases
need torch with CUDA and a libflashattn built with CUDA. Both skip otherwise."""
import contextlib

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


def test_attention_bhsd_bottom_right_and_expanded_bias_grad():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 33, 16, generator=g, requires_grad=True)
    k = torch.randn(2, 2, 41, 16, generator=g, requires_grad=True)
    v = torch.randn(2, 2, 41, 16, generator=g, requires_grad=True)
    small = torch.randn(1, 4, 33, 41, generator=g, requires_grad=True)
    out = flashattn.attention(q, k, v, causal=True, align="bottom_right", bias=small.expand(2, 4, 33, 41),
                              layout="bhsd")
    ref_in = [t.detach().clone().requires_grad_(True) for t in (q, k, v, small)]
    mask = torch.ones(33, 41, dtype=torch.bool).tril(41 - 33)
    bias = ref_in[3].masked_fill(~mask, float("-inf"))
    ref = torch.nn.functional.scaled_dot_product_attention(
        ref_in[0], ref_in[1].repeat_interleave(2, 1), ref_in[2].repeat_interleave(2, 1), attn_mask=bias)
    do = torch.randn(out.shape, generator=g)
    assert out.shape == (2, 4, 33, 16)
    assert (out - ref).abs().max().item() < 1e-5
    for a, b in zip(torch.autograd.grad(out, (q, k, v, small), do), torch.autograd.grad(ref, ref_in, do)):
        assert (a - b).abs().max().item() < 1e-4


@pytest.mark.parametrize("layout", ["bhsd", "sliced", "bias_permuted", "sliced_slopes"])
def test_saved_tensors_hooks_that_return_dense_copies_give_the_same_gradients(layout):
    """save_on_cpu(pin_memory=True) saves dense copies (on the CPU too, without pinning):
    the backward must run on a plan for their strides, not on its forward's."""
    g = torch.Generator().manual_seed(3)
    b, s, h, d = 2, 19, 4, 16
    if layout == "sliced":
        q, k, v = (torch.randn(b, s, h, 2 * d, generator=g)[..., :d] for _ in range(3))
    elif layout in ("bias_permuted", "sliced_slopes"):  # dense q, k, v: only the bias or slopes come back dense
        q, k, v = (torch.randn(b, s, h, d, generator=g) for _ in range(3))
    else:
        q, k, v = (torch.randn(b, h, s, d, generator=g).transpose(1, 2) for _ in range(3))
    bias = torch.randn(b, s, h, s, generator=g).transpose(1, 2) if layout == "bias_permuted" else None
    # Per-(batch, head) ALiBi slopes whose batch stride (2h) the plan takes from the forward's.
    slopes = torch.rand(b, 2 * h, generator=g)[:, :h] if layout == "sliced_slopes" else None
    do = torch.randn(b, s, h, d, generator=g)

    def grads(hooked):
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v) + ((bias,) if bias is not None else ())]
        with torch.autograd.graph.save_on_cpu(pin_memory=True) if hooked else contextlib.nullcontext():
            out = flashattn.attention(*leaves[:3], causal=True, bias=leaves[3] if bias is not None else None,
                                      alibi_slopes=slopes)
        return torch.autograd.grad(out, leaves, do)

    for a, w in zip(grads(True), grads(False)):
        assert (a - w).abs().max().item() < 1e-5


def test_attention_varlen_matches_per_sequence_sdpa():
    cu_q = torch.tensor([0, 5, 5, 17], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 12, 20], dtype=torch.int32)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(17, 2, 8, generator=g, requires_grad=True)
    k = torch.randn(20, 2, 8, generator=g, requires_grad=True)
    v = torch.randn(20, 2, 8, generator=g, requires_grad=True)
    out = flashattn.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    do = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad(out, (q, k, v), do)
    rq, rk, rv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    pieces = []
    for b in range(3):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if q1 == q0:
            continue
        o = torch.nn.functional.scaled_dot_product_attention(rq[q0:q1].transpose(0, 1), rk[k0:k1].transpose(0, 1),
                                                             rv[k0:k1].transpose(0, 1))
        pieces.append(o.transpose(0, 1))
    ref = torch.cat(pieces)
    assert (out - ref).abs().max().item() < 1e-5
    for a, b in zip(grads, torch.autograd.grad(ref, (rq, rk, rv), do)):
        assert (a - b).abs().max().item() < 1e-4


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
