"""flashattn.flash_attn_interface against FlashAttention 2's documented semantics, with an
fp64 reference written from FA2's docstrings (bottom-right causal and window alignment,
symmetric ALiBi, softcap), seqlen_q != seqlen_k throughout; gradients included."""
import math

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable: the FA2 interface tests need it")

import flashattn  # noqa: E402
from flashattn import flash_attn_interface as fa  # noqa: E402


def fa2_reference(q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, softmax_scale=None):
    """fp64 attention as FA2 documents it; q (b, sq, h, d), k/v (b, sk, hk, d)."""
    q, k, v = (x.double() for x in (q, k, v))
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(h // hk, dim=2)
    v = v.repeat_interleave(h // hk, dim=2)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, dtype=torch.float64)[:, None] + (sk - sq)  # bottom-right aligned row
    j = torch.arange(sk, dtype=torch.float64)[None, :]
    if alibi_slopes is not None:
        slopes = alibi_slopes.double()  # (h,) or (b, h)
        s = s - (slopes[None] if slopes.dim() == 1 else slopes)[:, :, None, None] * (i - j).abs()
    left, right = window_size
    if causal:
        right = 0
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # fully masked rows give 0, as in FA2
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


def _inputs(b, sq, sk, h, hk, d, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)  # noqa: E731
    return mk(b, sq, h, d), mk(b, sk, hk, d), mk(b, sk, hk, d)


def _check(out, ref, leaves, tol=2e-5):
    assert out.shape == ref.shape
    assert (out.double() - ref).abs().max().item() < tol
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    got = torch.autograd.grad(out, leaves, g.to(out.dtype))
    want = torch.autograd.grad(ref, leaves, g)
    for a, w in zip(got, want):
        assert a.shape == w.shape
        assert (a.double() - w).abs().max().item() < 5 * tol * max(1.0, w.abs().max().item())


CASES = [
    dict(),
    dict(causal=True),
    dict(window_size=(5, 3)),
    dict(window_size=(4, -1)),
    dict(causal=True, window_size=(6, -1)),
    dict(softcap=2.0, softmax_scale=0.3),
    dict(alibi=True),
    dict(alibi=True, causal=True),
    dict(alibi="batch"),
    dict(alibi="batch", causal=True, softcap=3.0),
]


@pytest.mark.parametrize("sq,sk", [(13, 29), (29, 13), (1, 17)])
@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join("%s=%s" % kv for kv in c.items()) or "plain")
def test_flash_attn_func_matches_fa2_semantics(sq, sk, case):
    case = dict(case)
    q, k, v = _inputs(2, sq, sk, 4, 2, 16)
    alibi = case.pop("alibi", False)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]) if alibi else None
    if alibi == "batch":  # (batch, heads): each sequence its own slopes
        slopes = torch.stack([slopes, slopes.flip(0) * 1.5])
    out = fa.flash_attn_func(q, k, v, alibi_slopes=slopes, **case)
    _check(out, fa2_reference(q, k, v, alibi_slopes=slopes, **case), (q, k, v))


def test_causal_with_more_queries_than_keys_masks_the_first_rows_fully():
    q, k, v = _inputs(1, 9, 4, 2, 2, 8)
    out = fa.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(out[:, :5], torch.zeros_like(out[:, :5]))  # rows 0..4 see no key (bottom-right)
    _check(out, fa2_reference(q, k, v, causal=True), (q, k, v))


def test_qkvpacked_and_kvpacked():
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(2, 11, 3, 4, 16, generator=g, requires_grad=True)
    out = fa.flash_attn_qkvpacked_func(qkv, causal=True)
    _check(out, fa2_reference(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True), (qkv,))
    q = torch.randn(2, 7, 4, 16, generator=g, requires_grad=True)
    kv = torch.randn(2, 12, 2, 2, 16, generator=g, requires_grad=True)
    out = fa.flash_attn_kvpacked_func(q, kv, causal=True, window_size=(3, 0))
    _check(out, fa2_reference(q, kv[:, :, 0], kv[:, :, 1], causal=True, window_size=(3, 0)), (q, kv))


def _varlen_reference(q, k, v, cu_q, cu_k, **kw):
    pieces = []
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        kb = dict(kw)
        if kb.get("alibi_slopes") is not None and kb["alibi_slopes"].dim() == 2:
            kb["alibi_slopes"] = kb["alibi_slopes"][b]
        pieces.append(fa2_reference(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], **kb)[0])
    return torch.cat(pieces)


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(window_size=(2, 1)),
                                dict(causal=True, alibi_slopes=torch.tensor([0.3, 0.1])),
                                dict(alibi_slopes=torch.tensor([[0.3, 0.1], [0.05, 0.6], [1.0, 0.2]])),
                                dict(causal=True, alibi_slopes=torch.tensor([[0.3, 0.1, 9.0], [0.05, 0.6, 9.0],
                                                                              [1.0, 0.2, 9.0]])[:, :2])])
def test_varlen_per_sequence_bottom_right(kw):
    cu_q = torch.tensor([0, 3, 10, 12], dtype=torch.int32)
    cu_k = torch.tensor([0, 8, 13, 25], dtype=torch.int32)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(12, 2, 8, generator=g, requires_grad=True)
    k = torch.randn(25, 1, 8, generator=g, requires_grad=True)
    v = torch.randn(25, 1, 8, generator=g, requires_grad=True)
    out = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 12, **kw)
    _check(out, _varlen_reference(q, k, v, cu_q, cu_k, **kw), (q, k, v))


def test_varlen_packed_variants():
    cu = torch.tensor([0, 5, 14], dtype=torch.int32)
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(14, 3, 2, 8, generator=g, requires_grad=True)
    out = fa.flash_attn_varlen_qkvpacked_func(qkv, cu, 9, causal=True)
    _check(out, _varlen_reference(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, causal=True), (qkv,))
    cu_k = torch.tensor([0, 7, 10], dtype=torch.int32)
    q = torch.randn(14, 2, 8, generator=g, requires_grad=True)
    kv = torch.randn(10, 2, 2, 8, generator=g, requires_grad=True)
    out = fa.flash_attn_varlen_kvpacked_func(q, kv, cu, cu_k, 9, 7, causal=True)
    _check(out, _varlen_reference(q, kv[:, 0], kv[:, 1], cu, cu_k, causal=True), (q, kv))


def test_deterministic_backward_is_bitwise_reproducible():
    q, k, v = _inputs(1, 10, 14, 2, 2, 8)
    grads = []
    for _ in range(2):
        out = fa.flash_attn_func(q, k, v, causal=True, deterministic=True)
        grads.append(torch.autograd.grad(out.sum(), (q, k, v)))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_dropout_draws_from_torch_generator():
    q, k, v = _inputs(1, 16, 16, 2, 2, 8)
    torch.manual_seed(11)
    a = fa.flash_attn_func(q, k, v, dropout_p=0.3)
    torch.manual_seed(11)
    b = fa.flash_attn_func(q, k, v, dropout_p=0.3)
    c = fa.flash_attn_func(q, k, v, dropout_p=0.3)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.allclose(a, fa.flash_attn_func(q, k, v))


def test_refused_arguments_name_themselves():
    q, k, v = _inputs(1, 4, 4, 2, 2, 8)
    with pytest.raises(flashattn.NotSupportedError, match="return_attn_probs=True"):
        fa.flash_attn_func(q, k, v, return_attn_probs=True)
    with pytest.raises(flashattn.InvalidArgumentError, match=r"alibi_slopes has shape \(3, 2\)"):
        fa.flash_attn_func(q, k, v, alibi_slopes=torch.ones(3, 2))  # batch is 1
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(flashattn.NotSupportedError, match="block_table"):
        fa.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 4, 4, block_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(flashattn.NotSupportedError, match="return_attn_probs"):
        fa.flash_attn_qkvpacked_func(torch.stack([q, k, v], 2), return_attn_probs=True)
