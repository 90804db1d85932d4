"""Ring attention: each rank of a process group holds a shard of Q, K and V; the K/V
shards travel around the ring (rank r sends to r+1 and receives from r-1) while every
rank attends its queries to the block it holds, and the partial (O, LSE) are merged with
flashattn_combine. The backward sends K/V around again, together with the partial sums
of dK/dV of the block each rank holds, and runs the library's backward per block with the
global output and LSE.

Causal attention needs zig-zag shards (see _shard.py): rank r holds chunks r and 2W-1-r.
Against the block of rank src, rank r then attends
  src == r: all its queries to all its keys, causal (top-left: the local order is the global one);
  src <  r: all its queries to src's first chunk, unmasked;
  src >  r: its second chunk of queries to all of src's keys, unmasked;
so every step but the first does half a block's work on every rank, and no rank idles.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import _torch_plans as P
from .._combine import combine
from .._lib import Status, make_error


class _Shift:
    """One asynchronous exchange with the ring neighbours: send tensors to rank+1 and
    receive same-shaped tensors from rank-1 (batch_isend_irecv), waited for later."""

    def __init__(self, group, tag):
        self.group = group
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (rank + 1) % world)
        self.prev = dist.get_global_rank(group, (rank - 1) % world)
        self.tag = tag
        self.reqs = []
        self.bufs = None

    def start(self, tensors):
        self.bufs = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group, self.tag + i) for i, t in enumerate(tensors)]
        ops += [dist.P2POp(dist.irecv, b, self.prev, self.group, self.tag + i) for i, b in enumerate(self.bufs)]
        self.reqs = dist.batch_isend_irecv(ops)

    def wait(self):
        """The received tensors (the sent ones may be reused from here on)."""
        for r in self.reqs:
            r.wait()
        self.reqs = []
        bufs, self.bufs = self.bufs, None
        return bufs


class _Layout:
    """Which rows of the local queries meet which local keys at each step, and the
    plan-cache options (see flashattn._torch_ops.OPTIONS) of that block."""

    def __init__(self, n, rank, world, causal, scale, softcap, deterministic):
        self.rank, self.world, self.causal = rank, world, causal
        self.all, self.first, self.second = slice(0, n), slice(0, n // 2), slice(n // 2, n)
        self.opts = {c: (0, 0, -1, 0 if c else -1, False, float(scale or 0.0), float(softcap or 0.0), False, 0.0, 0,
                         0, bool(deterministic), 0) for c in (False, True)}

    def block(self, step):
        """(query rows, key rows, options) of the block met at `step`: the block of rank
        (rank - step) mod world."""
        if not self.causal:
            return self.all, self.all, self.opts[False]
        src = (self.rank - step) % self.world
        if src == self.rank:
            return self.all, self.all, self.opts[True]
        if src < self.rank:
            return self.all, self.first, self.opts[False]
        return self.second, self.all, self.opts[False]


def _rows(t, rows, dim=1):
    return t if rows.stop - rows.start == t.shape[dim] else t[(slice(None),) * dim + (rows,)]


def _block_fwd(q, kv, lay, step):
    rows, cols, opts = lay.block(step)
    return P.forward(_rows(q, rows), _rows(kv[0], cols), _rows(kv[1], cols), None, None, None, None, None, None,
                     opts, True)


def ring_forward(q, k, v, lay, group):
    """(out, lse) of this rank's queries against the keys of every rank."""
    # The plan of the local block checks shapes, heads, dtype and device before any transfer starts.
    P.entry(q, k, v, None, None, None, None, None, lay.block(0)[2])
    world = lay.world
    if world == 1:
        return _block_fwd(q, (k, v), lay, 0)
    shift = _Shift(group, 0)
    b, n, h, dv = q.shape[0], q.shape[1], q.shape[2], v.shape[3]
    # Slot 0 holds the merged result so far (fp32), slot 1 the block just computed.
    o_part = torch.empty((2, b, n, h, dv), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((2, b, h, n), dtype=torch.float32, device=q.device)
    kv = (k, v)
    for step in range(world):
        last = step + 1 == world
        if not last:
            shift.start(kv)
        rows = lay.block(step)[0]
        o_i, lse_i = _block_fwd(q, kv, lay, step)
        slot = 0 if step == 0 else 1
        o_part[slot][:, rows].copy_(o_i)
        lse_part[slot][:, :, rows].copy_(lse_i)
        del o_i, lse_i
        if step and not last:
            o_m, lse_m = combine(o_part[:, :, rows], lse_part[:, :, :, rows])
            o_part[0][:, rows].copy_(o_m)
            lse_part[0][:, :, rows].copy_(lse_m)
            del o_m, lse_m
        if not last:
            kv = tuple(shift.wait())
    # The last merge writes its rows of the output in q's dtype; the other rows are final already.
    out = torch.empty((b, n, h, dv), dtype=q.dtype, device=q.device)
    _, lse_m = combine(o_part[:, :, rows], lse_part[:, :, :, rows], out=out[:, rows])
    lse = lse_part[0]
    lse[:, :, rows].copy_(lse_m)
    for rest in (slice(0, rows.start), slice(rows.stop, n)):
        if rest.stop > rest.start:
            out[:, rest].copy_(o_part[0][:, rest])
    return out, lse


def ring_backward(dout, q, k, v, out, lse, lay, group):
    """(dq, dk, dv) of this rank's shards: dq from every rank's keys, dk and dv from every
    rank's queries (their partial sums travel with the block and end at its owner).

    Sums are kept in the inputs' dtype, each addition done in fp32 and rounded once: with
    two ranks that is bitwise fp32 accumulation followed by the final rounding; every
    further rank adds one rounding of a partial sum."""
    world = lay.world
    kv_shift, grad_shift = _Shift(group, 0), _Shift(group, 2)
    # The row halves of out, dout and lse, made once (a copy for b > 1) for the steps that use them.
    halves = {}
    for step in range(world):
        rows = lay.block(step)[0]
        if (rows.start, rows.stop) not in halves:
            halves[rows.start, rows.stop] = (_rows(out, rows).contiguous(), _rows(dout, rows).contiguous(),
                                             _rows(lse, rows, 2).contiguous())
    kv = (k, v)
    dq = dk = dv = None
    for step in range(world):
        last = step + 1 == world
        if not last:
            kv_shift.start(kv)
        rows, cols, opts = lay.block(step)
        o_r, do_r, lse_r = halves[rows.start, rows.stop]
        dq_i, dk_i, dv_i, _ = P.backward(do_r, _rows(q, rows), _rows(kv[0], cols), _rows(kv[1], cols), o_r, lse_r,
                                         None, None, None, None, None, None, opts, False)
        if step == 0:  # the diagonal block: every row and column
            dq, dk, dv = dq_i, dk_i, dv_i
        else:
            dq[:, rows] += dq_i
            dk, dv = grad_shift.wait()
            dk[:, cols] += dk_i
            dv[:, cols] += dv_i
        del dq_i, dk_i, dv_i
        if not last:
            kv = tuple(kv_shift.wait())
        if world > 1:
            grad_shift.start((dk, dv))
    if world > 1:
        dk, dv = grad_shift.wait()
    return dq, dk, dv


class _RingAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, softcap, deterministic, group):
        lay = _Layout(q.shape[1], dist.get_rank(group), dist.get_world_size(group), causal, scale, softcap,
                      deterministic)
        out, lse = ring_forward(q, k, v, lay, group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (lay, group)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(dout.contiguous(), q, k, v, out, lse, *ctx.args)
        return dq, dk, dv, None, None, None, None, None


def _check(q, k, v, causal, group):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise make_error(Status.INVALID_ARGUMENT, "ring_attention(): %s must be a torch.Tensor (got %s)"
                             % (name, type(t).__name__))
        if t.dim() != 4:
            raise make_error(Status.INVALID_SHAPE, "%s has shape %s; ring_attention takes (batch, seq, heads, dim) "
                             "shards" % (name, tuple(t.shape)))
        if t.device != q.device:
            raise make_error(Status.WRONG_MEMORY_SPACE, "%s is on %s but q is on %s" % (name, t.device, q.device))
        if t.dtype != q.dtype:
            raise make_error(Status.INVALID_ARGUMENT, "%s has dtype %s but q has %s" % (name, t.dtype, q.dtype))
    if k.shape[:3] != v.shape[:3] or k.shape[0] != q.shape[0]:
        raise make_error(Status.INVALID_SHAPE, "k %s and v %s must match q %s in batch, and each other in seq and "
                         "heads" % (tuple(k.shape), tuple(v.shape), tuple(q.shape)))
    if k.shape[1] != q.shape[1]:
        raise make_error(Status.INVALID_SHAPE, "k has %d tokens but q has %d: ring attention is self-attention over "
                         "equal shards of one sequence" % (k.shape[1], q.shape[1]))
    if causal and q.shape[1] % 2:
        raise make_error(Status.INVALID_SHAPE, "q has %d tokens: causal ring attention takes zig-zag shards (two "
                         "equal chunks; see zigzag_shard)" % q.shape[1])
    if not dist.is_available() or not dist.is_initialized():
        raise make_error(Status.INVALID_ARGUMENT, "ring_attention() needs torch.distributed initialized "
                         "(dist.init_process_group)")
    if group is not None and dist.get_rank(group) < 0:
        raise make_error(Status.INVALID_ARGUMENT, "this process (global rank %d) is not a member of group"
                         % dist.get_rank())


def ring_attention(q, k, v, *, causal=False, scale=None, softcap=None, deterministic=False, group=None,
                   return_lse=False):
    """Attention over a sequence split across the ranks of `group` (default: the world).

    q (batch, n, heads_q, dim), k and v (batch, n, heads_kv, dim / dim_v): this rank's
    shard of the sequence, the same n on every rank; heads_q a multiple of heads_kv (GQA).
    With causal=True the shards must be zig-zag (:func:`zigzag_shard`); without it any
    split of the sequence works (rows are independent and keys are summed over).
    Returns this rank's shard of the output (and its fp32 LSE (batch, heads_q, n) with
    return_lse=True); differentiable in q, k and v. Every rank must call it with the same
    shapes, dtype and options. CPU tensors need a gloo group, CUDA tensors an NCCL one;
    CUDA work runs on the current stream."""
    _check(q, k, v, causal, group)
    group = group if group is not None else dist.group.WORLD
    out, lse = _RingAttention.apply(q, k, v, bool(causal), scale, softcap, bool(deterministic), group)
    return (out, lse) if return_lse else out
