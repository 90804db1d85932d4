"""The torch path of flashattn.attention: the plan cache, masks as SDPA takes them,
autocast and dtype rules as SDPA's, the padding helpers, and the custom ops under
torch.compile (fullgraph) and torch.library.opcheck. CPU tensors (the CPU backend)."""
import threading

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable: the torch-path tests need it")

import flashattn  # noqa: E402
from flashattn import _torch_ops, _torch_plans  # noqa: E402
from flashattn.bert_padding import pad_input, unpad_input  # noqa: E402

sdpa = torch.nn.functional.scaled_dot_product_attention


def _randn(*shape, seed=0, dtype=torch.float32, grad=False):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return t.requires_grad_(grad)


def _sdpa_bshd(q, k, v, **kw):
    rep = q.shape[2] // k.shape[2]
    o = sdpa(q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(rep, 1), v.transpose(1, 2).repeat_interleave(rep, 1),
             **kw)
    return o.transpose(1, 2)


# ---------------------------------------------------------------- plan cache


def test_plan_cache_hits_for_same_layout_and_misses_for_new_strides():
    _torch_plans.clear_cache()
    q, k, v = _randn(2, 9, 4, 16, seed=1), _randn(2, 12, 2, 16, seed=2), _randn(2, 12, 2, 16, seed=3)
    a = flashattn.attention(q, k, v, causal=True)
    assert _torch_plans.cache_size() == 1
    b = flashattn.attention(q.clone(), k.clone(), v.clone(), causal=True)
    assert _torch_plans.cache_size() == 1 and torch.equal(a, b)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, (b, h, s, d) memory
    c = flashattn.attention(qt, k, v, causal=True)
    assert _torch_plans.cache_size() == 2
    assert qt.stride() != q.stride() and torch.allclose(a, c, atol=1e-6)
    flashattn.attention(q, k, v, causal=False)
    assert _torch_plans.cache_size() == 3


# Calls that share the plan cache: each differs from the others in one thing a plan
# depends on (shape, dtype, strides, an option, a bias or dropout seed).
_CASES = {
    "base": dict(shape=(2, 7, 4, 16, 9, 2)),
    "causal": dict(shape=(2, 7, 4, 16, 9, 2), causal=True),
    "bottom_right": dict(shape=(2, 7, 4, 16, 9, 2), causal=True, align="bottom_right"),
    "window": dict(shape=(2, 7, 4, 16, 9, 2), window=(2, 1)),
    "scale_softcap": dict(shape=(2, 7, 4, 16, 9, 2), scale=0.3, softcap=5.0),
    "other_shape": dict(shape=(1, 5, 2, 8, 5, 2)),
    "fp16": dict(shape=(2, 7, 4, 16, 9, 2), dtype=torch.float16),
    "bhsd_strides": dict(shape=(2, 7, 4, 16, 9, 2), layout="bhsd"),
    "sliced_strides": dict(shape=(2, 7, 4, 16, 9, 2), sliced=True),  # not dense: grads get dense strides
    "bias": dict(shape=(2, 7, 4, 16, 9, 2), bias=True),
    "dropout": dict(shape=(2, 7, 4, 16, 9, 2), dropout_p=0.25, seed=11),
}


def _case_inputs(name):
    c = dict(_CASES[name])
    b, sq, hq, d, sk, hk = c.pop("shape")
    dtype = c.pop("dtype", torch.float32)
    q, k, v = _randn(b, sq, hq, d, seed=1), _randn(b, sk, hk, d, seed=2), _randn(b, sk, hk, d, seed=3)
    do = _randn(b, sq, hq, d, seed=4)
    if c.get("layout") == "bhsd":
        q, k, v, do = (t.transpose(1, 2).contiguous() for t in (q, k, v, do))
    if c.pop("sliced", False):
        q, k, v = (torch.cat([t, t], -1)[..., :d] for t in (q, k, v))
    leaves = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
    if c.pop("bias", False):
        c["bias"] = _randn(1, hq, sq, sk, seed=5, grad=True)
        leaves.append(c["bias"])
    return leaves, do.to(dtype), c


def _forward(name):
    leaves, do, kw = _case_inputs(name)
    return leaves, do, flashattn.attention(*leaves[:3], **kw)


def _grads(leaves, do, out):
    out.backward(do)
    return [out.detach()] + [t.grad for t in leaves]


def _fresh(name):
    """Output and gradients of one call on an empty cache."""
    _torch_plans.clear_cache()
    return _grads(*_forward(name))


def _assert_same(got, want, what):
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), "%s: tensor %d differs from a fresh call" % (what, i)


def test_calls_alternating_between_cached_plans_match_fresh_calls():
    fresh = {name: _fresh(name) for name in _CASES}
    _torch_plans.clear_cache()
    for _ in range(2):
        for name in _CASES:
            _assert_same(_grads(*_forward(name)), fresh[name], name)
    assert _torch_plans.cache_size() == len(_CASES)
    # All forwards first, then the backwards in the opposite order: each backward runs on
    # the plan of its own forward, whichever ran last.
    graphs = {name: _forward(name) for name in _CASES}
    for name in reversed(list(_CASES)):
        _assert_same(_grads(*graphs[name]), fresh[name], name + " (interleaved)")


def test_backward_uses_its_forwards_plan_after_the_cache_drops_it():
    want = _fresh("causal")
    _torch_plans.clear_cache()
    leaves, do, out = _forward("causal")
    _torch_plans.clear_cache()
    _assert_same(_grads(leaves, do, out), want, "causal")
    assert _torch_plans.cache_size() == 0  # the backward looked nothing up


def test_cache_is_bounded_and_drops_the_oldest_plan(monkeypatch):
    monkeypatch.setattr(_torch_plans, "CACHE_SIZE", 3)
    _torch_plans.clear_cache()
    qkv = [[_randn(1, n, 2, 8, seed=s) for s in (1, 2, 3)] for n in range(1, 6)]
    opts = (0, 0, -1, -1, False, 0.0, 0.0, False, 0.0, 0, 0, False, 0)

    def lookup(i):
        return _torch_plans.entry(*qkv[i], None, None, None, None, None, opts)

    first = [lookup(i) for i in range(5)]
    assert _torch_plans.cache_size() == 3
    assert all(lookup(i) is first[i] for i in (2, 3, 4))  # the newest three stayed
    assert lookup(0) is not first[0] and _torch_plans.cache_size() == 3
    for i in range(5):
        ref = _sdpa_bshd(*qkv[i])
        assert (flashattn.attention(*qkv[i]) - ref).abs().max().item() < 1e-5


def test_threads_sharing_a_small_cache_get_the_results_of_fresh_calls(monkeypatch):
    names = ["base", "causal", "window", "other_shape", "fp16", "bias"]
    fresh = {name: _fresh(name) for name in names}
    monkeypatch.setattr(_torch_plans, "CACHE_SIZE", 2)  # every thread keeps evicting the others' plans
    _torch_plans.clear_cache()
    errors = []

    def worker(offset):
        try:
            for i in range(24):
                name = names[(i + offset) % len(names)]
                _assert_same(_grads(*_forward(name)), fresh[name], name)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert _torch_plans.cache_size() <= 2


def test_outputs_follow_the_dimension_order_of_q():
    q = _randn(2, 4, 11, 16, seed=1)  # (b, h, s, d)
    k, v = _randn(2, 4, 7, 16, seed=2), _randn(2, 4, 7, 16, seed=3)
    out = flashattn.attention(q, k, v, layout="bhsd")
    assert out.shape == (2, 4, 11, 16) and out.is_contiguous()
    assert (out - sdpa(q, k, v)).abs().max().item() < 1e-5


def test_bad_inputs_raise_specific_errors():
    q = _randn(1, 8, 2, 16)
    with pytest.raises(flashattn.InvalidArgumentError, match="k has element type fp16 but q has fp32"):
        flashattn.attention(q, q.half(), q)
    with pytest.raises(flashattn.InvalidArgumentError, match="q has shape"):
        flashattn.attention(q[0], q, q)
    with pytest.raises(flashattn.InvalidArgumentError, match="bias shape .* does not broadcast"):
        flashattn.attention(q, q, q, bias=torch.zeros(1, 3, 8, 8))
    with pytest.raises(flashattn.InvalidArgumentError, match="attn_mask has dtype torch.int64"):
        flashattn.attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.int64))
    with pytest.raises(flashattn.InvalidArgumentError, match="key_padding_mask has shape"):
        flashattn.attention(q, q, q, key_padding_mask=torch.ones(8, dtype=torch.bool))
    with pytest.raises(flashattn.InvalidArgumentError, match="alibi_slopes must be fp32 of shape"):
        flashattn.attention(q, q, q, alibi_slopes=torch.ones(3))
    with pytest.raises(flashattn.InvalidArgumentError, match="causal=True with window right=2"):
        flashattn.attention(q, q, q, causal=True, window=(None, 2))
    with pytest.raises(flashattn.InvalidArgumentError, match="layout='sbhd'"):
        flashattn.attention(q, q, q, layout="sbhd")
    with pytest.raises(flashattn.InvalidArgumentError, match="v must be a torch.Tensor"):
        flashattn.attention(q, q, q.numpy())
    with pytest.raises(flashattn.InvalidArgumentError, match="head_dim_qk=300 exceeds the supported maximum"):
        flashattn.attention(_randn(1, 2, 1, 300), _randn(1, 2, 1, 300), _randn(1, 2, 1, 300))


# ---------------------------------------------------------------- masks


def test_bool_attn_mask_keeps_true_as_sdpa():
    q, k, v = (_randn(2, 10, 2, 8, seed=s, grad=True) for s in (1, 2, 3))
    mask = torch.rand(2, 1, 10, 10, generator=torch.Generator().manual_seed(4)) > 0.3
    mask[..., 0] = True  # no fully masked row (SDPA's result there is NaN)
    out = flashattn.attention(q, k, v, attn_mask=mask)
    ref = _sdpa_bshd(q, k, v, attn_mask=mask)
    assert (out - ref).abs().max().item() < 1e-5
    for a, b in zip(torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))):
        assert (a - b).abs().max().item() < 1e-4


def test_float_attn_mask_adds_and_gets_a_gradient():
    q, k, v = (_randn(1, 6, 2, 8, seed=s) for s in (1, 2, 3))
    m = _randn(6, 9, seed=5, grad=True)
    k, v = _randn(1, 9, 2, 8, seed=6), _randn(1, 9, 2, 8, seed=7)
    out = flashattn.attention(q, k, v, attn_mask=m)
    ref = _sdpa_bshd(q, k, v, attn_mask=m)
    assert (out - ref).abs().max().item() < 1e-5
    (ga,), (gb,) = torch.autograd.grad(out.sum(), (m,)), torch.autograd.grad(ref.sum(), (m,))
    assert ga.shape == m.shape and (ga - gb).abs().max().item() < 1e-4


def test_key_padding_mask_and_unpad_pad_roundtrip():
    b, s, h, d = 3, 11, 2, 8
    lengths = torch.tensor([11, 4, 7])
    keep = torch.arange(s)[None, :] < lengths[:, None]
    q, k, v = (_randn(b, s, h, d, seed=i) for i in (1, 2, 3))
    padded = flashattn.attention(q, k, v, causal=True, key_padding_mask=keep)
    ref = _sdpa_bshd(q, k, v, attn_mask=keep[:, None, None, :] & torch.ones(s, s, dtype=torch.bool).tril())
    assert (padded - ref).abs().max().item() < 1e-5
    qu, idx, cu, maxlen, used = unpad_input(q, keep)
    ku, vu = unpad_input(k, keep)[0], unpad_input(v, keep)[0]
    assert qu.shape == (int(lengths.sum()), h, d) and cu.tolist() == [0, 11, 15, 22] and maxlen == 11
    assert cu.dtype == torch.int32 and used.tolist() == [11, 4, 7]
    out = pad_input(flashattn.attention(qu, ku, vu, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                        max_seqlen_q=maxlen, max_seqlen_k=maxlen), idx, b, s)
    assert out.shape == (b, s, h, d)
    assert (out[keep] - padded[keep]).abs().max().item() < 1e-5
    assert torch.equal(out[~keep], torch.zeros_like(out[~keep]))


def test_unpad_input_with_unused_mask_and_pad_input_gradient():
    x = _randn(2, 5, 3, seed=1, grad=True)
    used = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    unused = torch.tensor([[0, 0, 1, 0, 0], [0, 0, 0, 0, 0]])
    xu, idx, cu, maxlen, seqused = unpad_input(x, used, unused)
    assert idx.tolist() == [0, 1, 2, 5, 6, 7] and cu.tolist() == [0, 3, 6] and maxlen == 3
    assert seqused.tolist() == [2, 3]
    back = pad_input(xu * 2, idx, 2, 5)
    (g,) = torch.autograd.grad(back.sum(), (x,))
    assert torch.equal(g.reshape(10, 3)[idx], torch.full((6, 3), 2.0))
    assert g.reshape(10, 3)[[3, 4, 8, 9]].abs().sum().item() == 0


# ---------------------------------------------------------------- autocast and dtypes


def test_autocast_casts_like_sdpa():
    q, k, v = (_randn(2, 16, 2, 16, seed=s) for s in (1, 2, 3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = flashattn.attention(q, k, v, causal=True)
        ref = _sdpa_bshd(q, k, v, is_causal=True)
    assert out.dtype == ref.dtype == torch.bfloat16
    assert (out.float() - ref.float()).abs().max().item() < 2e-2


def test_mixed_dtypes_outside_autocast_are_refused_as_sdpa_refuses_them():
    q = _randn(1, 4, 1, 8)
    with pytest.raises(RuntimeError):
        sdpa(q, q.bfloat16(), q)
    with pytest.raises(flashattn.InvalidArgumentError, match="k has element type bf16 but q has fp32"):
        flashattn.attention(q, q.bfloat16(), q)


# ---------------------------------------------------------------- torch.compile and the custom ops


def _op_args(q, k, v, bias=None, cu=(None, None), causal=True, maxlen=(0, 0)):
    return (q, k, v, bias, None, cu[0], cu[1], None, None, maxlen[0], maxlen[1], -1, 0 if causal else -1, False,
            0.0, 0.0, False, 0.0, 0, 0, False, 0)


def test_custom_ops_pass_opcheck():
    q, k, v = _randn(2, 5, 4, 8, grad=True), _randn(2, 7, 2, 8, seed=1, grad=True), _randn(2, 7, 2, 8, seed=2,
                                                                                          grad=True)
    torch.library.opcheck(_torch_ops.fwd, _op_args(q, k, v))
    bias = _randn(1, 4, 5, 7, seed=3, grad=True)
    torch.library.opcheck(_torch_ops.fwd, _op_args(q, k, v, bias=bias, causal=False))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)
    torch.library.opcheck(_torch_ops.fwd, _op_args(q[0], k[0], v[0], cu=cu, maxlen=(3, 4)))
    q, k, v, bias = (t.detach() for t in (q, k, v, bias))  # the backward op has no derivative itself
    out, lse = _torch_ops.fwd(*_op_args(q, k, v, bias=bias, causal=False))
    torch.library.opcheck(_torch_ops.bwd, (torch.ones_like(out), q, k, v, out, lse) + _op_args(
        q, k, v, bias=bias, causal=False)[3:] + (True,))


class _Block(torch.nn.Module):
    def __init__(self, dim=32, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.hk, self.d = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.d)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x, dropout_p=0.0):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.h, self.d)
        k, v = self.kv(x).view(b, n, 2, self.hk, self.d).unbind(2)
        y = flashattn.attention(q, k, v, causal=True, dropout_p=dropout_p)
        return self.o(y.reshape(b, n, -1))


def test_compile_fullgraph_matches_eager_forward_and_backward():
    torch.manual_seed(0)
    m = _Block()
    x = _randn(2, 13, 32, seed=9)
    ref = m(x)
    ref.square().sum().backward()
    want = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    y = cm(x)
    y.square().sum().backward()
    assert (y - ref).abs().max().item() < 1e-5
    for p, w in zip(m.parameters(), want):
        assert (p.grad - w).abs().max().item() < 1e-4


def test_compile_fullgraph_with_dropout_and_inductor():
    torch.manual_seed(0)
    m = _Block()
    x = _randn(1, 8, 32, seed=9)
    cm = torch.compile(m, fullgraph=True)
    torch.manual_seed(5)
    a = cm(x, 0.25)
    torch.manual_seed(5)
    b = cm(x, 0.25)
    assert torch.equal(a, b)
    a.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_compile_fullgraph_under_autocast_matches_eager():
    q, k, v = (_randn(2, 12, 2, 16, seed=s, grad=True) for s in (1, 2, 3))

    def f(q, k, v):
        return flashattn.attention(q, k, v, causal=True)

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = cf(q, k, v), f(q, k, v)
    assert got.dtype == want.dtype == torch.bfloat16 and torch.equal(got, want)
    (g,) = torch.autograd.grad(got.float().sum(), (q,))
    assert g.dtype == torch.float32 and torch.isfinite(g).all() and g.abs().sum() > 0
