"""The torch path on a GPU: CUDA-graph capture of forward + backward, torch.compile with
CUDA graphs (mode="reduce-overhead"), the FA2 interface and autocast against SDPA. Skipped
without torch with CUDA and a CUDA build of libflashattn (run them on a GPU machine:
FLASHATTN_LIBRARY=build/default/libflashattn.so.0 python3 -m pytest -rs
bindings/python/tests/test_torch_cuda.py)."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not importable: the CUDA torch tests need it")

import flashattn  # noqa: E402
from flashattn.flash_attn_interface import flash_attn_func  # noqa: E402

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
