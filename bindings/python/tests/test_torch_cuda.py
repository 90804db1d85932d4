"""The torch path on a GPU: CUDA-graph capture of forward + backward, torch.compile with
CUDA graphs (mode="reduce-overhead"), the FA2 interface and autocast against SDPA,
flash_attn_with_kvcache against the CPU backend. Skipped
without torch with CUDA and a CUDA build of libflashattn (run them on a GPU machine:
FLASHATTN_LIBRARY=build/default/libflashattn.so.0 python3 -m pytest -rs
bindings/python/tests/test_torch_cuda.py)."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not importable: the CUDA torch tests need it")

import flashattn  # noqa: E402
from flashattn.flash_attn_interface import flash_attn_func, flash_attn_with_kvcache  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and flashattn.has_cuda_backend() and flashattn.cuda_device_count() > 0),
    reason="needs torch with CUDA, a GPU and a CUDA build of libflashattn")

sdpa = torch.nn.functional.scaled_dot_product_attention


def _qkv(seed, b=2, sq=96, sk=128, h=8, hk=2, d=64, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, device="cuda", dtype=dtype)  # noqa: E731
    return mk(b, sq, h, d), mk(b, sk, hk, d), mk(b, sk, hk, d), mk(b, sq, h, d)


def _eager(q, k, v, do):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = flashattn.attention(*leaves, causal=True, align="bottom_right")
    out.backward(do)
    return [out.detach()] + [t.grad for t in leaves]


def test_cuda_graph_capture_of_forward_and_backward_replays_new_inputs():
    q, k, v, do = _qkv(0)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: plan cache and allocator, outside the capture
        for _ in range(3):
            flashattn.attention(*leaves, causal=True, align="bottom_right").backward(do)
    torch.cuda.current_stream().wait_stream(side)
    for t in leaves:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashattn.attention(*leaves, causal=True, align="bottom_right")
        out.backward(do)
    q2, k2, v2, do2 = _qkv(1)
    with torch.no_grad():
        for t, new in zip(leaves, (q2, k2, v2)):
            t.copy_(new)
        do.copy_(do2)
    graph.replay()
    torch.cuda.synchronize()
    want = _eager(q2, k2, v2, do2)
    for got, ref in zip([out] + [t.grad for t in leaves], want):
        assert (got.float() - ref.float()).abs().max().item() < 1e-2  # dq may be summed in another order


def test_compile_reduce_overhead_matches_eager():
    q, k, v, do = _qkv(2)

    def f(q, k, v):
        return flashattn.attention(q, k, v, causal=True, align="bottom_right")

    cf = torch.compile(f, fullgraph=True, mode="reduce-overhead")
    want = _eager(q, k, v, do)
    for _ in range(3):  # record, then replay the CUDA graphs
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = cf(*leaves)
        out.backward(do)
    for got, ref in zip([out] + [t.grad for t in leaves], want):
        assert (got.float() - ref.float()).abs().max().item() < 1e-2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fa2_interface_matches_sdpa_bottom_right(dtype):
    q, k, v, _ = _qkv(3, sq=50, sk=77, dtype=dtype)
    out = flash_attn_func(q, k, v, causal=True)
    mask = torch.ones(50, 77, dtype=torch.bool, device="cuda").tril(77 - 50)
    ref = sdpa(q.transpose(1, 2).float(), k.transpose(1, 2).repeat_interleave(4, 1).float(),
               v.transpose(1, 2).repeat_interleave(4, 1).float(), attn_mask=mask).transpose(1, 2)
    assert (out.float() - ref).abs().max().item() < 2e-2


def test_autocast_fp32_inputs_run_in_bf16_like_sdpa():
    q, k, v, _ = _qkv(4, dtype=torch.float32, hk=8)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = flashattn.attention(q, k, v, causal=True)
        ref = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    assert out.dtype == ref.dtype == torch.bfloat16
    assert (out.float() - ref.float()).abs().max().item() < 3e-2


def _kvcache_inputs(device, dtype=torch.bfloat16, b=3, page=16, per_seq=8, hq=8, hk=2, d=128):
    g = torch.Generator().manual_seed(5)
    mk = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    pool = b * per_seq + 2
    angle = mk(page * per_seq, d // 2)
    t = dict(q=mk(b, 1, hq, d), k_cache=mk(pool, page, hk, d), v_cache=mk(pool, page, hk, d), k=mk(b, 1, hk, d),
             v=mk(b, 1, hk, d), rotary_cos=angle.cos(), rotary_sin=angle.sin(),
             cache_seqlens=torch.tensor([0, 37, page * per_seq - 1], dtype=torch.int32),
             block_table=torch.randperm(pool, generator=g)[:b * per_seq].reshape(b, per_seq).to(torch.int32))
    return {n: x.to(device) for n, x in t.items()}


def _kvcache_run(t, **kw):
    return flash_attn_with_kvcache(t["q"], t["k_cache"], t["v_cache"], t["k"], t["v"], t["rotary_cos"],
                                   t["rotary_sin"], cache_seqlens=t["cache_seqlens"], block_table=t["block_table"],
                                   causal=True, return_softmax_lse=True, **kw)


@pytest.mark.parametrize("alibi", [False, True], ids=["no-alibi", "alibi-per-batch-and-head"])
def test_kvcache_paged_decode_matches_the_cpu_backend(alibi):
    cpu, gpu = _kvcache_inputs("cpu"), _kvcache_inputs("cuda")
    # (batch, heads) slopes: each sequence has its own, as the decode kernel must read them.
    slopes = torch.rand(3, 8, generator=torch.Generator().manual_seed(6)) if alibi else None
    want = _kvcache_run(cpu, alibi_slopes=slopes)
    got = _kvcache_run(gpu, alibi_slopes=None if slopes is None else slopes.cuda())
    torch.cuda.synchronize()
    assert (got[0].float().cpu() - want[0].float()).abs().max().item() < 2e-2
    assert (got[1].cpu() - want[1]).abs().max().item() < 1e-2
    assert (gpu["k_cache"].float().cpu() - cpu["k_cache"].float()).abs().max().item() < 2e-2  # rotated
    assert torch.equal(gpu["v_cache"].cpu(), cpu["v_cache"])


def test_kvcache_host_tables_for_a_cuda_run_are_refused():
    t = _kvcache_inputs("cuda")
    with pytest.raises(flashattn.FlashAttnError) as e:
        _kvcache_run(dict(t, cache_seqlens=t["cache_seqlens"].cpu()))
    assert e.value.status == flashattn.Status.WRONG_MEMORY_SPACE and "cache_seqlens" in str(e.value)
