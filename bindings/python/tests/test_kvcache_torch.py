"""flash_attn_with_kvcache (FA2's signature) on CPU tensors against the fp64 reference of
kvcache_reference.py, the flashattn::fwd_kvcache custom op under torch.compile (fullgraph,
the in-place append visible to the caller) and torch.library.opcheck, the plan cache, and
bad input (a specific error naming the argument, the caches untouched)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not importable: the torch KV-cache tests need it")

import flashattn  # noqa: E402
from flashattn import Status  # noqa: E402
from flashattn._torch_kvcache import fwd_kvcache  # noqa: E402
from flashattn._torch_plans import cache_size  # noqa: E402
from flashattn.flash_attn_interface import flash_attn_with_kvcache  # noqa: E402

from test_kvcache import CASES, TOL, case, check_against_reference  # noqa: E402

_TENSORS = ("q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens", "cache_batch_idx",
            "block_table")


def _torch(c, dtype=None):
    """The case's arrays as fresh torch tensors (floating ones cast to dtype when given)."""
    t = {n: torch.from_numpy(np.array(c[n])) for n in _TENSORS if n in c}
    if dtype is not None:
        t = {n: x.to(dtype) if x.is_floating_point() else x for n, x in t.items()}
    return t


def _fa2_options(opts, heads):
    """flash_attn_with_kvcache keywords for CASES options (FA2 has symmetric ALiBi only)."""
    left, right = opts.get("window") or (-1, -1)
    fa = dict(causal=opts.get("causal", False), window_size=(left, right), softcap=opts.get("softcap", 0.0),
              softmax_scale=opts.get("scale"), rotary_interleaved=opts.get("rotary_interleaved", True))
    ref = dict(causal=fa["causal"], window=(left, right), softcap=fa["softcap"], scale=fa["softmax_scale"],
               rotary_interleaved=fa["rotary_interleaved"])
    if opts.get("alibi"):
        slopes = torch.linspace(0.1, 0.9, heads, dtype=torch.float32)
        fa["alibi_slopes"], ref["alibi_slopes"] = slopes, slopes.numpy()
    return fa, ref


FA2_CASES = sorted(n for n, (_, o) in CASES.items() if o.get("alibi_symmetric", True))


@pytest.mark.parametrize("name", FA2_CASES)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_fa2_interface_matches_reference(name, num_splits):
    args, opts = CASES[name]
    c = case(**args)
    t = _torch(c)
    fa, ref = _fa2_options(opts, c["q"].shape[2])
    out, lse = flash_attn_with_kvcache(t["q"], t["k_cache"], t["v_cache"], t.get("k"), t.get("v"),
                                       rotary_cos=t.get("rotary_cos"), rotary_sin=t.get("rotary_sin"),
                                       cache_seqlens=t["cache_seqlens"], cache_batch_idx=t.get("cache_batch_idx"),
                                       block_table=t.get("block_table"), num_splits=num_splits,
                                       return_softmax_lse=True, **fa)
    check_against_reference(c, out.numpy(), lse.numpy(), t["k_cache"].numpy(), t["v_cache"].numpy(),
                            TOL[np.float32], **ref)


def test_alibi_slopes_per_sequence_match_per_head_runs():
    """(batch, heads) slopes, FA2's second form: each sequence's rows equal a run of that sequence
    alone with its row of slopes as per-head slopes (paged cache, causal, two query tokens)."""
    c = case(b=3, sq=2, page=3, capacity=20, lens=[7, 0, 18])
    t = _torch(c)
    slopes = torch.linspace(0.05, 1.2, 3 * 4, dtype=torch.float32).reshape(3, 4)
    out = flash_attn_with_kvcache(t["q"], t["k_cache"], t["v_cache"], cache_seqlens=t["cache_seqlens"],
                                  block_table=t["block_table"], causal=True, alibi_slopes=slopes)
    for b in range(3):
        one = flash_attn_with_kvcache(t["q"][b:b + 1], t["k_cache"], t["v_cache"],
                                      cache_seqlens=t["cache_seqlens"][b:b + 1],
                                      block_table=t["block_table"][b:b + 1], causal=True, alibi_slopes=slopes[b])
        assert torch.equal(out[b:b + 1], one), b
    # Broadcast rows (stride 0) are the per-head form.
    same = flash_attn_with_kvcache(t["q"], t["k_cache"], t["v_cache"], cache_seqlens=t["cache_seqlens"],
                                   block_table=t["block_table"], causal=True,
                                   alibi_slopes=slopes[0].expand(3, 4))
    ref = flash_attn_with_kvcache(t["q"], t["k_cache"], t["v_cache"], cache_seqlens=t["cache_seqlens"],
                                  block_table=t["block_table"], causal=True, alibi_slopes=slopes[0])
    assert torch.equal(same, ref)


def test_bf16_paged_prefill_with_rotary():
    c = case(page=3, capacity=20, sq=3, sn=3, rotary_dim=8)
    t = _torch(c, torch.bfloat16)
    out = flash_attn_with_kvcache(t["q"], t["k_cache"], t["v_cache"], t["k"], t["v"], t["rotary_cos"],
                                  t["rotary_sin"], cache_seqlens=t["cache_seqlens"], block_table=t["block_table"],
                                  causal=True, rotary_interleaved=False)
    assert out.dtype == torch.bfloat16
    c16 = {n: (x.float().numpy() if x.is_floating_point() else x.numpy()) for n, x in _torch(c, torch.bfloat16).items()}
    check_against_reference(c16, out.float().numpy(), None, t["k_cache"].float().numpy(),
                            t["v_cache"].float().numpy(), 3e-2, causal=True, rotary_interleaved=False)


def test_cache_seqlens_as_int_and_none():
    c = case(b=2, capacity=12, lens=[5, 5], sn=1)
    t = _torch(c)
    out = flash_attn_with_kvcache(t["q"], t["k_cache"], t["v_cache"], t["k"], t["v"], cache_seqlens=5)
    check_against_reference(c, out.numpy(), None, t["k_cache"].numpy(), t["v_cache"].numpy(), TOL[np.float32])
    c = case(b=2, capacity=12, lens=[12, 12])  # None: every sequence attends to its whole cache row
    t = _torch(c)
    out = flash_attn_with_kvcache(t["q"], t["k_cache"], t["v_cache"])
    check_against_reference(c, out.numpy(), None, t["k_cache"].numpy(), t["v_cache"].numpy(), TOL[np.float32])
    c = case(b=2, page=4, capacity=12, lens=[12, 12])
    t = _torch(c)
    out = flash_attn_with_kvcache(t["q"], t["k_cache"], t["v_cache"], block_table=t["block_table"])
    check_against_reference(c, out.numpy(), None, t["k_cache"].numpy(), t["v_cache"].numpy(), TOL[np.float32])


def test_decode_steps_reuse_one_cached_plan():
    c = case(b=2, capacity=16, lens=[0, 4], sn=1, rotary_dim=16)
    t = _torch(c)
    lens = t["cache_seqlens"].clone()
    sizes = []
    for _ in range(4):
        step = dict(c, k_cache=t["k_cache"].numpy().copy(), v_cache=t["v_cache"].numpy().copy(),
                    cache_seqlens=lens.numpy().copy())
        out = flash_attn_with_kvcache(t["q"], t["k_cache"], t["v_cache"], t["k"], t["v"], t["rotary_cos"],
                                      t["rotary_sin"], cache_seqlens=lens, causal=True)
        check_against_reference(step, out.numpy(), None, t["k_cache"].numpy(), t["v_cache"].numpy(),
                                TOL[np.float32], causal=True, rotary_interleaved=True)
        sizes.append(cache_size())
        lens += 1
    assert sizes[1:] == sizes[:-1]


def _fn(q, k_cache, v_cache, k, v, cos, sin, lens):
    return flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens=lens, causal=True,
                                   return_softmax_lse=True)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_appends_in_place_and_matches_eager(backend):
    c = case(b=2, sq=2, sn=2, capacity=16, rotary_dim=8, lens=[3, 9])
    eager, compiled = _torch(c), _torch(c)
    args = ("q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens")
    want = _fn(*(eager[n] for n in args))
    cf = torch.compile(_fn, fullgraph=True, backend=backend)
    got = cf(*(compiled[n] for n in args))
    assert torch.equal(compiled["k_cache"], eager["k_cache"]) and torch.equal(compiled["v_cache"], eager["v_cache"])
    assert not torch.equal(compiled["k_cache"], torch.from_numpy(c["k_cache"]))
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-6, rtol=1e-6)


def test_opcheck_schema_fake_and_mutation():
    c = case(b=2, sn=1, capacity=10, rotary_dim=8, lens=[0, 6])
    t = _torch(c)
    args = (t["q"], t["k_cache"], t["v_cache"], t["k"], t["v"], t["rotary_cos"], t["rotary_sin"],
            t["cache_seqlens"], None, None, None, -1, 0, 0.0, 0.0, True, 0)
    torch.library.opcheck(fwd_kvcache, args)


def _refused(t, status, words, **kw):
    """flash_attn_with_kvcache raises `status` naming every word and leaves the caches as they were."""
    before = (t["k_cache"].clone(), t["v_cache"].clone())
    call = dict(k=t.get("k"), v=t.get("v"), rotary_cos=t.get("rotary_cos"), rotary_sin=t.get("rotary_sin"),
                cache_seqlens=t.get("cache_seqlens"), cache_batch_idx=t.get("cache_batch_idx"),
                block_table=t.get("block_table"))
    call.update(kw)
    with pytest.raises(flashattn.FlashAttnError) as e:
        flash_attn_with_kvcache(t["q"], t["k_cache"], t["v_cache"], **call)
    assert e.value.status == status, e.value
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert torch.equal(t["k_cache"], before[0]) and torch.equal(t["v_cache"], before[1])


def test_bad_input_is_refused_with_the_caches_untouched():
    t = _torch(case(sn=1, rotary_dim=8))
    _refused(t, Status.NOT_SUPPORTED, ["cache_leftpad"], cache_leftpad=torch.zeros(3, dtype=torch.int32))
    _refused(t, Status.INVALID_SHAPE, ["alibi_slopes", "(5, 4)"], alibi_slopes=torch.ones(5, 4))
    _refused(t, Status.NULL_POINTER, ["cache_seqlens"], cache_seqlens=None)
    _refused(t, Status.DTYPE_NOT_SUPPORTED, ["cache_seqlens", "int64"],
             cache_seqlens=t["cache_seqlens"].to(torch.int64))
    _refused(t, Status.NULL_POINTER, ["k and v"], v=None)
    _refused(t, Status.INVALID_SEQLENS, ["cache_seqlens"], cache_seqlens=24)
    _refused(t, Status.INVALID_SHAPE, ["k_new"], k=t["k"][:, :, :1])
    _refused(t, Status.INVALID_ARGUMENT, ["rotary_cos", "fp16"], rotary_cos=t["rotary_cos"].half())
    _refused(t, Status.INVALID_VALUE, ["num_splits"], num_splits=5000)
    t = _torch(case(rows=4, batch_idx=True, sn=1))
    _refused(t, Status.INVALID_VALUE, ["cache_batch_idx"], cache_batch_idx=torch.tensor([0, 1, 9], dtype=torch.int32))
    t = _torch(case(page=3, sn=1))
    bad = t["block_table"].clone()
    bad[1, 0] = -1
    _refused(t, Status.INVALID_VALUE, ["block_table"], block_table=bad)
    _refused(t, Status.WRONG_MEMORY_SPACE, ["block_table"], block_table=t["block_table"].to("meta"))
