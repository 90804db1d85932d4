"""Ring attention against one process: the check every rank runs, for the distributed
tests (gloo, CPU tensors) and for benchmarks/ring_check.sh (NCCL, CUDA tensors).

Each case draws the full sequence on every rank (same seed), runs ring_attention on the
rank's zig-zag shard (forward and loss.backward()), gathers the shards and compares
output, LSE and the gradients of q, k, v with the fp64 reference (tolerances of
docs/cli.md) and with one flashattn run on the whole sequence (twice them)."""
from __future__ import annotations

import collections
import os

import torch
import torch.distributed as dist

import flashattn
from flashattn.distributed import ring_attention, zigzag_gather, zigzag_shard

#: Tolerances (O, LSE, dQ/dK/dV) against the fp64 reference, as `flashattn check` uses them.
TOL = {torch.float16: (3e-3, 1e-4, 1e-2), torch.bfloat16: (2e-2, 1e-4, 5e-2), torch.float32: (1e-4, 2e-5, 5e-4)}
FLOOR = {"out": 1e-3, "lse": 1.0, "dq": 1e-3, "dk": 1e-3, "dv": 1e-3}

Case = collections.namedtuple("Case", "batch chunk heads_q heads_kv head_dim head_dim_v dtype causal softcap "
                                      "deterministic")


def case(batch=2, chunk=37, heads_q=4, heads_kv=2, head_dim=16, head_dim_v=None, dtype=torch.float32, causal=True,
         softcap=None, deterministic=False):
    """A Case: the sequence has 2 * world_size * chunk tokens."""
    return Case(batch, chunk, heads_q, heads_kv, head_dim, head_dim_v or head_dim, dtype, causal, softcap,
                deterministic)


def reference(q, k, v, causal, softcap):
    """(out, lse) in fp64, differentiable: the textbook softmax(q k^T * scale) v."""
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if causal:
        n = q.shape[1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v), lse


def _inputs(c, world, device, seed):
    g = torch.Generator().manual_seed(seed)
    n = 2 * world * c.chunk
    shapes = ((c.batch, n, c.heads_q, c.head_dim), (c.batch, n, c.heads_kv, c.head_dim),
              (c.batch, n, c.heads_kv, c.head_dim_v), (c.batch, n, c.heads_q, c.head_dim_v))
    return [torch.randn(shp, generator=g).to(device=device, dtype=c.dtype) for shp in shapes]


def _grads(out, leaves, dout):
    return torch.autograd.grad(out, leaves, dout)


def _ring_run(c, q, k, v, dout, group):
    """Gathered out, lse, dq, dk, dv of ring attention over `group` on the full q, k, v."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    shards = [zigzag_shard(t, rank, world).requires_grad_(True) for t in (q, k, v)]
    out, lse = ring_attention(*shards, causal=c.causal, softcap=c.softcap, deterministic=c.deterministic,
                              group=group, return_lse=True)
    (out * zigzag_shard(dout, rank, world)).sum().backward()  # loss.backward() through the ring
    got = {"out": zigzag_gather(out.detach(), group), "lse": zigzag_gather(lse, group, dim=2)}
    for name, t in zip(("dq", "dk", "dv"), shards):
        got[name] = zigzag_gather(t.grad, group)
    return got


def run_twice_bitwise(c, group, device, seed=0):
    """Failure lines unless two ring runs of case c agree bit for bit (for a case with
    deterministic=True)."""
    q, k, v, dout = _inputs(c, dist.get_world_size(group), device, seed)
    first, second = _ring_run(c, q, k, v, dout, group), _ring_run(c, q, k, v, dout, group)
    return ["%s rank %d: %s differs between two deterministic runs" % (c, dist.get_rank(group), name)
            for name in first if not torch.equal(first[name], second[name])]


def run_case(c, group, device, seed=0):
    """Failure lines of one case on this rank of `group` (empty when it passes)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    q, k, v, dout = _inputs(c, world, device, seed)
    got = _ring_run(c, q, k, v, dout, group)

    ref64 = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    o64, lse64 = reference(*ref64, c.causal, c.softcap)
    want = {"out": o64, "lse": lse64}
    want.update(zip(("dq", "dk", "dv"), _grads(o64, ref64, dout.double())))

    one = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    o1 = flashattn.attention(*one, causal=c.causal, softcap=c.softcap)
    _, lse1 = flashattn.forward(*(t.detach() for t in one), causal=c.causal, softcap=c.softcap, return_lse=True)
    single = {"out": o1, "lse": lse1}
    single.update(zip(("dq", "dk", "dv"), _grads(o1, one, dout)))

    tol_o, tol_lse, tol_grad = TOL[c.dtype]
    fails = []
    for name, g in got.items():
        tol = {"out": tol_o, "lse": tol_lse}.get(name, tol_grad)
        for what, ref, factor in (("fp64 reference", want[name], 1), ("one process", single[name], 2)):
            ref = ref.detach().double()
            err = (g.double() - ref).abs().max().item()
            bound = factor * tol * max(ref.abs().max().item(), FLOOR[name])
            if not err <= bound:
                fails.append("%s rank %d/%d %s vs %s: max_abs %.3g > %.3g" % (c, rank, world, name, what, err, bound))
    return fails


def worker(rank, world, init_method, cases, subgroups=()):
    """Entry point of one spawned CPU process: joins a gloo group, runs the cases on the
    whole world, then the first case on each group of ranks in `subgroups`; raises on a
    failure."""
    import datetime
    os.environ["FLASHATTN_CPU_THREADS"] = "1"  # ranks share the host's cores
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        fails = []
        for i, c in enumerate(cases):
            fails += run_case(c, None, "cpu", seed=i)
        for ranks in subgroups:
            g = dist.new_group(ranks)  # every rank takes part in making every group
            if rank in ranks:
                fails += run_case(cases[0], g, "cpu", seed=99)
        assert not fails, "\n".join(fails)
    finally:
        dist.destroy_process_group()
