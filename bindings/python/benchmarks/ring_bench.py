"""Ring attention on the GPUs of one host: correctness on NCCL, then the issue 22 benchmark.

    torchrun --nproc_per_node=2 bindings/python/benchmarks/ring_bench.py     # (ring_check.sh runs this)

1. check: the cases of tests/ring_cases.py on CUDA tensors over NCCL (each rank compares
   the gathered output, LSE and gradients with the fp64 reference and one GPU's run), and
   two runs with deterministic=True compared bit for bit;
2. bench: bf16, head_dim 128, 16 heads, --tokens in total (zig-zag shards), causal and
   not: forward+backward time of ring attention on every GPU against one GPU running the
   whole sequence (rank 0 alone, the others waiting), or, when one GPU cannot hold it,
   against the ideal computed from one GPU at half the tokens (4x the work of half the
   sequence, shared by the GPUs); peak memory per GPU (torch's allocator, inputs
   included); the gathered ring results against the one-GPU ones; one GPU's backward over
   a rank's shard with and without gradient accumulation (the ring's backward adds).
Prints one table on rank 0.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "tests")]
import flashattn  # noqa: E402
from flashattn import _torch_plans as P  # noqa: E402
from flashattn.distributed import ring_attention, zigzag_gather, zigzag_shard  # noqa: E402
from flashattn.distributed._ring import block_opts  # noqa: E402

import ring_cases  # noqa: E402
from ring_cases import TOL, case  # noqa: E402

BF16 = torch.bfloat16
GIB = float(1 << 30)


def say(*a):
    if dist.get_rank() == 0:
        print(*a, flush=True)


def check():
    """True if every case passes on every rank."""
    cases = [case(batch=1, chunk=517, heads_q=16, heads_kv=16, head_dim=128, dtype=BF16, causal=c)
             for c in (True, False)]
    cases += [case(batch=2, chunk=300, heads_q=16, heads_kv=4, head_dim=128, dtype=BF16, causal=True),
              case(batch=1, chunk=129, heads_q=8, heads_kv=2, head_dim=64, dtype=torch.float16, causal=True),
              case(batch=1, chunk=77, heads_q=4, heads_kv=1, head_dim=64, dtype=BF16, causal=False)]
    runs = [("vs reference", ring_cases.run_case, c) for c in cases]
    runs.append(("deterministic", ring_cases.run_twice_bitwise, cases[0]._replace(deterministic=True)))
    ok = True
    for i, (what, fn, c) in enumerate(runs):
        fails = fn(c, None, "cuda", seed=i)
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, fails)
        lines = [f for rank_fails in every for f in rank_fails]
        say("check %-4s %-13s %s" % ("PASS" if not lines else "FAIL", what, c))
        for line in lines:
            say("    " + line)
        ok = ok and not lines
    return ok


def _flops(tokens, heads, dim, causal):
    """Forward + backward FLOPs of attention over `tokens` (backward = 2.5x forward)."""
    fwd = 4.0 * tokens * tokens * heads * dim
    return 3.5 * fwd * (0.5 if causal else 1.0)


def _timed(fn, warmup, iters, together):
    """Seconds per call of fn after warmup calls; together: every rank starts at once."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if together:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def _full_inputs(tokens, heads, dim, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn((1, tokens, heads, dim), generator=g, device="cuda", dtype=BF16) for _ in range(4)]


def one_gpu(tokens, heads, dim, causal, args):
    """(seconds per forward+backward, peak bytes, results on the host) of one GPU over the
    whole sequence; (None, None, None) when it runs out of memory."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        q, k, v, dout = _full_inputs(tokens, heads, dim, args.seed)
        leaves = [t.requires_grad_(True) for t in (q, k, v)]

        def step():
            out = flashattn.attention(*leaves, causal=causal)
            return (out,) + torch.autograd.grad(out, leaves, dout)

        sec = _timed(step, args.warmup, args.iters, False)
        results = [t.detach().cpu() for t in step()]
        return sec, torch.cuda.max_memory_allocated(), results
    except torch.OutOfMemoryError:
        return None, None, None


def ring(tokens, heads, dim, causal, args):
    """(seconds per forward+backward on the slowest rank, this rank's peak bytes, the
    gathered results) of ring attention over the world."""
    rank, world = dist.get_rank(), dist.get_world_size()
    full = _full_inputs(tokens, heads, dim, args.seed)
    q, k, v, dout = (zigzag_shard(t, rank, world) for t in full)
    del full
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    leaves = [t.requires_grad_(True) for t in (q, k, v)]

    def step():
        out = ring_attention(*leaves, causal=causal)
        return (out,) + torch.autograd.grad(out, leaves, dout)

    sec = _timed(step, args.warmup, args.iters, True)
    peak = torch.cuda.max_memory_allocated()
    slowest = torch.tensor([sec], device="cuda")
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    results = [zigzag_gather(t.detach()) for t in step()]
    return slowest.item(), peak, results


def accumulate_cost(tokens, heads, dim, causal, args):
    """(seconds plain, seconds accumulating) of one GPU's backward over `tokens` tokens
    (a rank's shard): the ring's backward adds into its gradients
    (flashattn_plan_set_grad_accumulate), whose epilogues read them back."""
    q, k, v, dout = _full_inputs(tokens, heads, dim, args.seed)
    opts = block_opts(causal)
    out, lse = P.forward(q, k, v, None, None, None, None, None, None, opts, True)
    grads = [torch.zeros_like(t) for t in (q, k, v)]
    return [_timed(lambda: P.backward_into(dout, q, k, v, out, lse, *grads, opts, acc), args.warmup, args.iters,
                   False) for acc in (False, True)]


def _max_rel(got, want):
    """Worst max_abs / max|ref| over out, dq, dk, dv, and whether each is within twice the
    bf16 tolerance of docs/cli.md."""
    tol_o, _, tol_grad = TOL[BF16]
    worst, ok = 0.0, True
    for i, (g, w) in enumerate(zip(got, want)):
        w = w.to(g.device).float()
        rel = (g.float() - w).abs().max().item() / max(w.abs().max().item(), 1e-3)
        worst = max(worst, rel)
        ok = ok and rel <= 2 * (tol_o if i == 0 else tol_grad)
    return worst, ok


HEADER = ("mask", "run", "GPUs", "fwd+bwd ms", "TFLOP/s per GPU", "vs 1 GPU", "target", "peak GiB per GPU",
          "max rel err vs 1 GPU")


def bench(args):
    """The benchmark table on rank 0; True if the ring's results match one GPU's."""
    world, rank = dist.get_world_size(), dist.get_rank()
    tokens, heads, dim = args.tokens, args.heads, args.head_dim
    rows, ok, costs = [], True, []
    for causal in (False, True):
        mask = "causal" if causal else "none"
        resr = None  # the last case's gathered results (on the GPU) must not count in this one's peaks
        torch.cuda.empty_cache()
        fits = [None]
        if rank == 0:
            sec1, mem1, res1 = one_gpu(tokens, heads, dim, causal, args)
            fits = [sec1 is not None]
            if not fits[0]:  # one GPU cannot hold the sequence: its rate at half the tokens
                half, _, _ = one_gpu(tokens // 2, heads, dim, causal, args)
        dist.broadcast_object_list(fits, src=0)
        if rank == 0:
            torch.cuda.empty_cache()
            costs.append((causal, accumulate_cost(tokens // world, heads, dim, causal, args)))
        dist.barrier()
        secr, memr, resr = ring(tokens, heads, dim, causal, args)
        peaks = [None] * world
        dist.all_gather_object(peaks, memr)
        if rank != 0:
            continue
        fl, peak = _flops(tokens, heads, dim, causal), max(peaks)
        if fits[0]:
            speedup = sec1 / secr
            err, err_ok = _max_rel(resr, res1)
            ok = ok and err_ok
            rows.append([mask, "1 GPU", "1", "%.1f" % (sec1 * 1e3), "%.0f" % (fl / sec1 / 1e12), "", "",
                         "%.2f" % (mem1 / GIB), ""])
            rows.append([mask, "ring", str(world), "%.1f" % (secr * 1e3), "%.0f" % (fl / secr / world / 1e12),
                         "%.2fx" % speedup, "%s (>= %.1fx)" % ("PASS" if speedup >= 0.9 * world else "below",
                                                               0.9 * world),
                         "%.2f (%.2f of 1 GPU)" % (peak / GIB, peak / mem1),
                         "%.1e %s" % (err, "ok" if err_ok else "FAIL")])
        else:
            ideal = half * 4 / world  # 4x the work of half the sequence, shared by the GPUs
            rows.append([mask, "1 GPU, %d tokens" % (tokens // 2), "1", "%.1f" % (half * 1e3),
                         "%.0f" % (fl / 4 / half / 1e12), "", "", "", ""])
            rows.append([mask, "ring", str(world), "%.1f" % (secr * 1e3), "%.0f" % (fl / secr / world / 1e12),
                         "%.0f%% of ideal" % (100 * ideal / secr),
                         "%s (>= 90%% of ideal; 1 GPU out of memory)" % ("PASS" if ideal / secr >= 0.9 else "below"),
                         "%.2f" % (peak / GIB), "n/a"])
    if rank == 0:
        print("\nring attention: bf16, batch 1, %d tokens, %d heads, head_dim %d, %d x %s, %d timed iterations"
              % (tokens, heads, dim, world, torch.cuda.get_device_name(), args.iters))
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
        for r in rows:
            print("| " + " | ".join(r) + " |")
        for causal, (plain, acc) in costs:
            print("one GPU backward over %d tokens (%s): %.1f ms, accumulating %.1f ms (%.3fx)"
                  % (tokens // world, "causal" if causal else "no mask", plain * 1e3, acc * 1e3, acc / plain))
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=131072, help="sequence length in total (default 131072)")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    args = p.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    try:
        say("library %s, torch %s, world %d" % (flashattn.library_path(), torch.__version__, dist.get_world_size()))
        ok = True
        if not args.skip_check:
            ok = check() and ok
        if not args.skip_bench:
            ok = bench(args) and ok
    finally:
        dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
