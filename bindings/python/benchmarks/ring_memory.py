"""Peak memory of ring attention per rank against one process running the whole sequence,
on the CPU over gloo: the bytes of torch tensors alive at the peak of one forward+backward
(inputs, output, gradients, the library's workspace, transfer buffers and every
temporary), from torch.profiler's allocation records of a second, warm run.

    python bindings/python/benchmarks/ring_memory.py [--world 2] [--tokens 8192] [--heads 16]
        [--head-dim 64] [--dtype bf16]

Needs torch with gloo and FLASHATTN_LIBRARY (or an installed libflashattn). Prints per
mask the peak of one process and of each ring rank in MiB and in units of one shard of Q
(tokens / world x heads x head_dim elements), next to the count of docs/distributed.md
(without the library's workspace: on CUDA the backward's fp32 dQ sums; on the CPU a few
tiles per thread, reported in a column of its own, since at small shards those tiles are
a sizeable fraction of a shard).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import flashattn  # noqa: E402
from flashattn import _torch_plans  # noqa: E402
from flashattn.distributed import ring_attention, zigzag_shard  # noqa: E402
from flashattn.distributed._ring import _head_groups  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _held_workspace():
    """Bytes of the calling thread's CPU workspace buffer (kept between runs)."""
    ws = getattr(_torch_plans._host, "workspace", None)
    return 0 if ws is None else ws.numel()


def peak_bytes(run, inputs):
    """Peak bytes of tensors alive during the second call of run() (the inputs and the
    held workspace, plus the highest running sum of the call's allocations and frees) and
    the workspace's bytes. The thread's workspace is dropped first, so that it holds what
    this run needs, not what an earlier, larger measurement left."""
    _torch_plans._host.workspace = None
    run()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        results = run()
        del results
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return sum(t.numel() * t.element_size() for t in inputs) + _held_workspace() + peak, _held_workspace()


def _full(args, seed):
    g = torch.Generator().manual_seed(seed)
    dt = DTYPES[args.dtype]
    return [torch.randn((1, args.tokens, args.heads, args.head_dim), generator=g).to(dt) for _ in range(4)]


def one_process(args, causal):
    q, k, v, dout = _full(args, 0)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]

    def run():
        out = flashattn.attention(*leaves, causal=causal)
        return (out,) + torch.autograd.grad(out, leaves, dout)

    return peak_bytes(run, (q, k, v, dout))


def ring(args, causal):
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v, dout = (zigzag_shard(t, rank, world).contiguous() for t in _full(args, 0))
    leaves = [t.requires_grad_(True) for t in (q, k, v)]

    def run():
        out = ring_attention(*leaves, causal=causal)
        return (out,) + torch.autograd.grad(out, leaves, dout)

    return peak_bytes(run, (q, k, v, dout))


def documented_units(world, groups):
    """docs/distributed.md's count per rank in shards, less the CUDA workspace: Q, K, V, dO
    and O (5), dQ (1), the K/V block at work and the one arriving (4), the dK/dV sums
    (2) and two head groups' sums arriving (4 / groups); with two ranks the block arriving
    during the first step replaces the one at work (the own K/V are among the 5)."""
    kv = 2 if world == 2 else 4
    return 5 + 1 + kv + 2 + 4.0 / groups


def worker(rank, args, init, result):
    """One rank: the one-process peaks (rank 0) and this rank's ring peaks, without and with
    a causal mask; rank 0 writes the rows (JSON) to `result`."""
    os.environ["FLASHATTN_CPU_THREADS"] = "1"  # ranks share the host's cores
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=600))
    try:
        shard = args.tokens // args.world * args.heads * args.head_dim * DTYPES[args.dtype].itemsize
        groups = len(_head_groups(args.heads, args.heads))
        rows = []
        for causal in (False, True):
            one = one_process(args, causal)[0] if rank == 0 else None
            dist.barrier()
            peaks = [None] * args.world
            dist.all_gather_object(peaks, ring(args, causal))
            peak, workspace = max(peaks)
            rows.append({"causal": causal, "shard_bytes": shard, "groups": groups, "one_units": (one or 0) / shard,
                         "ring_units": peak / shard, "ring_workspace_units": workspace / shard,
                         "documented_units": documented_units(args.world, groups)})
        if rank == 0:
            with open(result, "w") as f:
                json.dump(rows, f)
    finally:
        dist.destroy_process_group()


def measure(world=2, tokens=8192, heads=16, head_dim=64, dtype="bf16"):
    """The rows of the table (one per mask): peaks in units of one shard of Q."""
    args = argparse.Namespace(world=world, tokens=tokens, heads=heads, head_dim=head_dim, dtype=dtype)
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "rows.json")
        torch.multiprocessing.spawn(worker, args=(args, "file://" + os.path.join(tmp, "rendezvous"), result),
                                    nprocs=world)
        with open(result) as f:
            return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--tokens", type=int, default=8192, help="sequence length in total (a multiple of 2 * world)")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    a = p.parse_args()
    rows = measure(a.world, a.tokens, a.heads, a.head_dim, a.dtype)
    unit = rows[0]["shard_bytes"] / 2 ** 20
    print("ring attention memory on the CPU (gloo): %s, %d tokens, %d heads, head_dim %d, %d ranks, %d head groups; "
          "unit = one shard of Q = %.2f MiB" % (a.dtype, a.tokens, a.heads, a.head_dim, a.world, rows[0]["groups"], unit))
    print("| mask | one process MiB (units) | ring per rank MiB (units), max over ranks | of which CPU workspace "
          "(units) | ring / one process | documented ring count (units) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %.1f (%.2f) | %.1f (%.2f) | %.2f | %.3f | %.2f |"
              % ("causal" if r["causal"] else "none", r["one_units"] * unit, r["one_units"], r["ring_units"] * unit,
                 r["ring_units"], r["ring_workspace_units"], r["ring_units"] / r["one_units"],
                 r["documented_units"]))


if __name__ == "__main__":
    main()
