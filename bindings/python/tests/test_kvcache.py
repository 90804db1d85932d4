"""KV-cache runs on numpy arrays (flashattn.forward_kvcache, Plan.set_kvcache,
Plan.forward_kvcache) on the CPU backend, against the fp64 reference of
kvcache_reference.py: decode and short prefill, used lengths 0 and full, cache rows, append
with and without rotary (both forms, full and partial rotary_dim), paged caches (page sizes
1, 3, 16), GQA/MQA, causal/window/softcap/ALiBi, split counts, and bad input (a specific
error, the caches untouched)."""
import numpy as np
import pytest

import flashattn
from flashattn import InvalidArgumentError, Status

from kvcache_reference import kvcache_attention

TOL = {np.float32: 2e-5, np.float16: 4e-3}


def case(b=3, sq=1, hq=4, hkv=2, d=16, dv=None, capacity=24, sn=0, page=0, rotary_dim=0, lens=None, rows=None,
         batch_idx=False, dtype=np.float32, seed=0):
    """Inputs of one KV-cache run as numpy arrays (keys of flashattn.forward_kvcache).
    lens default: 0 for the first sequence, the full capacity for the last, random between."""
    rng = np.random.default_rng(seed)
    dv = d if dv is None else dv
    mk = lambda *s: rng.standard_normal(s).astype(dtype)  # noqa: E731
    c = dict(q=mk(b, sq, hq, d))
    if page:
        per_seq = -(-capacity // page)
        capacity = per_seq * page
        pool = b * per_seq + 3
        c["block_table"] = rng.permutation(pool)[:b * per_seq].reshape(b, per_seq).astype(np.int32)
        c["k_cache"], c["v_cache"] = mk(pool, page, hkv, d), mk(pool, page, hkv, dv)
    else:
        rows = b if rows is None else rows
        c["k_cache"], c["v_cache"] = mk(rows, capacity, hkv, d), mk(rows, capacity, hkv, dv)
        if batch_idx:
            c["cache_batch_idx"] = rng.permutation(rows)[:b].astype(np.int32)
    if lens is None:
        lens = rng.integers(0, capacity - sn + 1, size=b)
        lens[0], lens[-1] = 0, capacity - sn
    c["cache_seqlens"] = np.asarray(lens, dtype=np.int32)
    if sn:
        c["k"], c["v"] = mk(b, sn, hkv, d), mk(b, sn, hkv, dv)
    if rotary_dim:
        angle = np.arange(capacity + sq)[:, None] * (1e-2 ** (np.arange(rotary_dim // 2) / (rotary_dim // 2)))
        c["rotary_cos"], c["rotary_sin"] = np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)
    return c


def check_against_reference(c, out, lse, k_cache, v_cache, tol, **opts):
    """out/lse/caches of a run (numpy) against the reference for the inputs c (before the run)."""
    ro, rl, rk, rv = kvcache_attention(c["q"], c["k_cache"], c["v_cache"], c["cache_seqlens"], k=c.get("k"),
                                       v=c.get("v"), rotary_cos=c.get("rotary_cos"),
                                       rotary_sin=c.get("rotary_sin"), cache_batch_idx=c.get("cache_batch_idx"),
                                       block_table=c.get("block_table"), **opts)
    assert out.shape == ro.shape
    np.testing.assert_allclose(np.asarray(out, dtype=np.float64), ro, atol=tol, rtol=tol)
    if lse is not None:
        assert lse.shape == rl.shape and lse.dtype == np.float32
        assert np.array_equal(np.isneginf(lse), np.isneginf(rl))
        fin = np.isfinite(rl)
        np.testing.assert_allclose(lse[fin], rl[fin], atol=tol, rtol=tol)
    np.testing.assert_allclose(np.asarray(k_cache, dtype=np.float64), rk, atol=tol, rtol=tol)
    np.testing.assert_allclose(np.asarray(v_cache, dtype=np.float64), rv, atol=0, rtol=0)


# (case() arguments, run options)
CASES = {
    "decode": (dict(), dict()),
    "decode_gqa8": (dict(hq=16, hkv=2), dict()),
    "decode_mqa": (dict(hq=4, hkv=1), dict()),
    "decode_mha_dv": (dict(hq=3, hkv=3, d=8, dv=24), dict()),
    "append": (dict(sn=1), dict()),
    "append_rotary_half": (dict(sn=1, rotary_dim=16), dict(rotary_interleaved=False)),
    "append_rotary_interleaved": (dict(sn=1, rotary_dim=16), dict(rotary_interleaved=True)),
    "append_rotary_partial": (dict(sn=2, rotary_dim=6), dict(rotary_interleaved=False)),
    "prefill_causal_rotary": (dict(sq=5, sn=5, rotary_dim=16), dict(rotary_interleaved=True, causal=True)),
    "prefill_noncausal_rotary": (dict(sq=3, sn=3, rotary_dim=8), dict(rotary_interleaved=False)),
    "prefill_window_rotary": (dict(sq=4, sn=4, rotary_dim=16), dict(window=(3, 1))),
    "prefill_short_chunk": (dict(sq=6, sn=2), dict(causal=True)),
    "cache_batch_idx": (dict(rows=7, batch_idx=True, sn=2), dict(causal=True)),
    "paged_1": (dict(page=1, sn=1), dict()),
    "paged_3": (dict(page=3, sn=2, capacity=23, rotary_dim=16), dict(causal=True, rotary_interleaved=True)),
    "paged_16": (dict(page=16, capacity=70, sq=3, sn=3), dict(causal=True)),
    "window": (dict(sq=4, capacity=40), dict(window=(5, 0))),
    "window_both": (dict(sq=4, capacity=40, sn=1), dict(window=(2, 2))),
    "softcap_scale": (dict(sq=2), dict(softcap=3.0, scale=0.7)),
    "alibi_causal": (dict(sq=3, sn=3, hq=4, hkv=2), dict(causal=True, alibi=True, alibi_symmetric=True)),
    "alibi_symmetric": (dict(sq=2), dict(alibi=True, alibi_symmetric=True)),
    "alibi_one_sided": (dict(sq=2, sn=1), dict(alibi=True, alibi_symmetric=False)),
}


def _run(c, alibi=False, num_splits=0, **opts):
    slopes = np.linspace(0.1, 0.9, c["q"].shape[2]).astype(np.float32) if alibi else None
    run = {n: c[n] for n in ("k", "v", "rotary_cos", "rotary_sin", "cache_batch_idx", "block_table") if n in c}
    after = {n: c[n].copy() for n in ("k_cache", "v_cache")}
    out, lse = flashattn.forward_kvcache(c["q"], after["k_cache"], after["v_cache"], c["cache_seqlens"],
                                         alibi_slopes=slopes, num_splits=num_splits, return_lse=True, **run, **opts)
    return out, lse, after, slopes


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("num_splits", [0, 1, 3])
def test_matches_reference(name, num_splits):
    args, opts = CASES[name]
    c = case(**args)
    out, lse, after, slopes = _run(c, num_splits=num_splits, **opts)
    opts = {k: v for k, v in opts.items() if k != "alibi"}
    check_against_reference(c, out, lse, after["k_cache"], after["v_cache"], TOL[np.float32], alibi_slopes=slopes,
                            **opts)


def test_empty_sequence_gets_zero_and_minus_inf_and_full_cache_attends_everything():
    c = case(b=2, capacity=9, lens=[0, 9])
    out, lse, _, _ = _run(c)
    assert np.all(out[0] == 0) and np.all(np.isneginf(lse[0]))
    check_against_reference(c, out, lse, c["k_cache"], c["v_cache"], TOL[np.float32])


def test_fp16_paged_append_with_rotary():
    c = case(page=3, capacity=20, sq=2, sn=2, rotary_dim=16, dtype=np.float16)
    out, lse, after, _ = _run(c, causal=True, rotary_interleaved=False)
    assert out.dtype == np.float16
    check_against_reference(c, out, lse, after["k_cache"], after["v_cache"], TOL[np.float16], causal=True,
                            rotary_interleaved=False)


def test_heads_outer_paged_layout_through_strides():
    c = case(page=4, sn=1, capacity=16)
    hnd = {n: np.ascontiguousarray(c[n].transpose(0, 2, 1, 3)) for n in ("k_cache", "v_cache")}
    views = {n: a.transpose(0, 2, 1, 3) for n, a in hnd.items()}  # [page, token, head, dim] over HND memory
    assert views["k_cache"].strides != c["k_cache"].strides
    out, lse = flashattn.forward_kvcache(c["q"], views["k_cache"], views["v_cache"], c["cache_seqlens"], k=c["k"],
                                         v=c["v"], block_table=c["block_table"], return_lse=True)
    check_against_reference(c, out, lse, views["k_cache"], views["v_cache"], TOL[np.float32])


def test_split_counts_agree_and_the_default_split_is_the_dense_forward():
    c = case(b=1, hq=2, hkv=1, capacity=700, lens=[650], sq=1)
    outs = [_run(c, num_splits=n)[0] for n in (0, 1, 2, 5)]
    for out in outs[1:]:
        np.testing.assert_allclose(out, outs[0], atol=1e-6)
    # The dense varlen forward of one query row splits its 650 keys by the rule of
    # num_splits = 0 (docs/inference.md): 2 splits from max_seqlen_k 650 as from the
    # capacity 700.
    cu_q, cu_k = np.array([0, 1], dtype=np.int32), np.array([0, 650], dtype=np.int32)
    dense = flashattn.forward(c["q"][0], c["k_cache"][0, :650], c["v_cache"][0, :650], cu_seqlens_q=cu_q,
                              cu_seqlens_k=cu_k, max_seqlen_q=1, max_seqlen_k=650)
    assert np.array_equal(outs[0][0], dense)


def test_plan_level_runs_reuse_one_plan_over_steps():
    c = case(b=2, sn=1, capacity=12, lens=[0, 3])
    q, kc, vc = c["q"], c["k_cache"].copy(), c["v_cache"].copy()
    with flashattn.Plan(2, 1, 12, 4, 2, 16, dtype="fp32", backend="cpu") as plan:
        plan.set_mask(align="bottom_right", causal=True)
        plan.set_kvcache(2, seqlen_new=1)
        lay = plan.kvcache_layouts()
        assert lay["k_cache"] == ((2, 12, 2, 16), (384, 32, 16, 1)) and lay["k_new"][0] == (2, 1, 2, 16)
        lens = c["cache_seqlens"].copy()
        for step in range(3):
            step_c = dict(c, k_cache=kc.copy(), v_cache=vc.copy(), cache_seqlens=lens.copy())
            out, lse = plan.forward_kvcache(q, kc, vc, lens, k_new=c["k"], v_new=c["v"])
            check_against_reference(step_c, out, lse, kc, vc, TOL[np.float32], causal=True)
            lens += 1
        plan.set_kvcache()
        with pytest.raises(InvalidArgumentError) as e:
            plan.forward_kvcache(q, kc, vc, lens)
        assert e.value.status == Status.PLAN_INCOMPLETE and "set_kvcache" in e.value.message


def _refused(c, status, words, **kw):
    """The run raises `status` with a message containing every word, and writes nothing."""
    before = {n: c[n].copy() for n in ("k_cache", "v_cache")}
    out = np.full(c["q"].shape[:3] + (c["v_cache"].shape[3],), 7.0, dtype=c["q"].dtype)
    run = {n: c[n] for n in ("k", "v", "rotary_cos", "rotary_sin", "cache_batch_idx", "block_table") if n in c}
    run.update(kw)
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.forward_kvcache(c["q"], c["k_cache"], c["v_cache"], c["cache_seqlens"], out=out, **run)
    assert e.value.status == status, e.value
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert np.array_equal(c["k_cache"], before["k_cache"]) and np.array_equal(c["v_cache"], before["v_cache"])
    assert np.all(out == 7.0)


def test_bad_used_lengths_are_refused_before_anything_is_written():
    c = case(b=2, sn=2, capacity=10, lens=[3, 9])  # 9 + 2 > 10
    _refused(c, Status.INVALID_SEQLENS, ["cache_seqlens"])
    c = case(b=2, sn=1, capacity=10, lens=[3, -1])
    _refused(c, Status.INVALID_SEQLENS, ["cache_seqlens"])


def test_bad_cache_rows_and_pages_are_refused():
    c = case(rows=4, batch_idx=True, sn=1)
    c["cache_batch_idx"][1] = 4
    _refused(c, Status.INVALID_VALUE, ["cache_batch_idx"])
    c = case(rows=4, batch_idx=True, sn=1)
    c["cache_batch_idx"][1] = c["cache_batch_idx"][0]  # two sequences appending to one row
    _refused(c, Status.INVALID_VALUE, ["cache_batch_idx"])
    c = case(page=3, sn=1)
    c["block_table"][2, 0] = c["k_cache"].shape[0]
    _refused(c, Status.INVALID_VALUE, ["block_table"])
    c = case(page=3, sn=1)
    _refused(c, Status.INCOMPATIBLE_OPTIONS, ["cache_batch_idx"], cache_batch_idx=np.zeros(3, np.int32))


def test_bad_rotary_tables_are_refused():
    c = case(sn=1, rotary_dim=8)
    c["rotary_cos"], c["rotary_sin"] = c["rotary_cos"][:5], c["rotary_sin"][:5]  # positions past the tables
    _refused(c, Status.INVALID_SEQLENS, ["rotary"])
    c = case(sn=1, rotary_dim=8)
    _refused(c, Status.INVALID_SHAPE, ["rotary_sin", "(25, 4)"], rotary_sin=c["rotary_sin"][:, :3])
    c = case(sn=1, rotary_dim=8)
    _refused(c, Status.NULL_POINTER, ["rotary_sin"], rotary_sin=None)
    c = case(sn=1, d=16, rotary_dim=18)
    _refused(c, Status.INVALID_VALUE, ["rotary_dim=18"])
    c = case(rotary_dim=8)  # nothing appended: the cache would hold unrotated keys
    _refused(c, Status.INCOMPATIBLE_OPTIONS, ["rotary", "seqlen_new"])


def test_bad_shapes_dtypes_and_layouts_are_refused():
    c = case(sn=1)
    bad = dict(c, v_cache=c["v_cache"][:, :20])
    _refused(bad, Status.INVALID_SHAPE, ["v_cache", "(3, 24, 2, 16)"])
    bad = dict(c, v=c["v"][:, :, :1])
    _refused(bad, Status.INVALID_SHAPE, ["v_new", "(3, 1, 2, 16)"])
    bad = dict(c, cache_seqlens=c["cache_seqlens"][:2])
    _refused(bad, Status.INVALID_SHAPE, ["cache_seqlens", "(3,)"])
    bad = dict(c, v_cache=c["v_cache"].astype(np.float16))
    _refused(bad, Status.INVALID_ARGUMENT, ["v_cache", "fp16"])
    c2 = case()
    bad = dict(c2, k=None, v=c2["k_cache"][:, :1])
    _refused(bad, Status.NULL_POINTER, ["k and v"])
    ro = c["k_cache"].copy()
    ro.setflags(write=False)
    _refused(dict(c, k_cache=ro), Status.INVALID_ARGUMENT, ["k_cache", "read-only"])
    _refused(case(page=3), Status.INVALID_SHAPE, ["block_table"], block_table=np.zeros((3, 0), np.int32))
