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

import collections

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


#: Most groups of heads the work on one block is split into (see _head_groups).
_MAX_HEAD_GROUPS = 8


def _head_groups(heads_q, heads_kv):
    """(query heads, kv heads) slices of the groups each library call covers: as many
    groups as the largest divisor of heads_kv up to _MAX_HEAD_GROUPS, each a run of kv
    heads with their GQA query heads. A call's workspace (the fp32 dQ sums of its rows) and
    an exchange of gradient sums in flight are then a fraction of a shard."""
    groups = max(d for d in range(1, min(heads_kv, _MAX_HEAD_GROUPS) + 1) if heads_kv % d == 0)
    per, rep = heads_kv // groups, heads_q // heads_kv
    return [(slice(i * per * rep, (i + 1) * per * rep), slice(i * per, (i + 1) * per)) for i in range(groups)]


def block_opts(causal, scale=None, softcap=None, deterministic=False):
    """The plan-cache options (flashattn._torch_ops.OPTIONS) of a block: causal (top-left)
    or unmasked."""
    return (0, 0, -1, 0 if causal else -1, False, float(scale or 0.0), float(softcap or 0.0), False, 0.0, 0, 0,
            bool(deterministic), 0)


class _Layout:
    """Which rows of the local queries meet which local keys at each step, the plan-cache
    options (see flashattn._torch_ops.OPTIONS) of that block, and the head groups."""

    def __init__(self, n, heads_q, heads_kv, rank, world, causal, scale, softcap, deterministic):
        self.rank, self.world, self.causal = rank, world, causal
        self.all, self.first, self.second = slice(0, n), slice(0, n // 2), slice(n // 2, n)
        self.opts = {c: block_opts(c, scale, softcap, deterministic) for c in (False, True)}
        self.groups = _head_groups(heads_q, heads_kv)

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


def _merge(o, lse, o_i, lse_i):
    """o, lse (views of the output so far and its LSE) merged with a block's o_i, lse_i by
    flashattn_combine, in fp32, written back in o's dtype."""
    part = torch.empty((2,) + tuple(o_i.shape), dtype=torch.float32, device=o_i.device)
    part[0].copy_(o)
    part[1].copy_(o_i)
    lse_part = torch.empty((2,) + tuple(lse_i.shape), dtype=torch.float32, device=o_i.device)
    lse_part[0].copy_(lse)
    lse_part[1].copy_(lse_i)
    _, lse_m = combine(part, lse_part, out=o)
    lse.copy_(lse_m)


def ring_forward(q, k, v, lay, group):
    """(out, lse) of this rank's queries against the keys of every rank.

    Per block and head group: the library's forward, then the merge into the output so far
    (the first block's output is the start). With two ranks that is the merge of the two
    partial outputs in fp32, rounded once; each further rank adds one rounding of the
    output so far."""
    # The plan of the local block checks shapes, heads, dtype and device before any transfer starts.
    P.entry(q, k, v, None, None, None, None, None, lay.block(0)[2])
    world = lay.world
    if world == 1:
        return P.forward(q, k, v, None, None, None, None, None, None, lay.block(0)[2], True)
    shift = _Shift(group, 0)
    b, n, h, dv = q.shape[0], q.shape[1], q.shape[2], v.shape[3]
    out = q.new_empty((b, n, h, dv))
    lse = torch.empty((b, h, n), dtype=torch.float32, device=q.device)
    kv = (k, v)
    for step in range(world):
        last = step + 1 == world
        if not last:
            shift.start(kv)
        rows, cols, opts = lay.block(step)
        for qh, kh in lay.groups:
            o_i, lse_i = P.forward(_rows(q, rows)[:, :, qh], _rows(kv[0], cols)[:, :, kh],
                                   _rows(kv[1], cols)[:, :, kh], None, None, None, None, None, None, opts, True)
            if step == 0:  # the diagonal block: every row
                out[:, :, qh].copy_(o_i)
                lse[:, qh].copy_(lse_i)
            else:
                _merge(_rows(out, rows)[:, :, qh], _rows(lse, rows, 2)[:, qh], o_i, lse_i)
            del o_i, lse_i
        if not last:
            kv = tuple(shift.wait())
    return out, lse


class _Sums:
    """The dK/dV sums of the block this rank holds, per head group, and their exchanges:
    after this rank's work on group j of a block, its sums go to rank+1 (which meets the
    block next) and the sums of the next block come from rank-1. At most two exchanges are
    in flight, so that one overlaps the next group's work and the buffers being received
    stay two groups' worth."""

    def __init__(self, k, v, groups, group):
        self.sums = [(k.new_empty(k[:, :, kh].shape), v.new_empty(v[:, :, kh].shape)) for _, kh in groups]
        self.group = group
        self.pending = collections.deque()  # (head group, _Shift)

    def send_on(self, j):
        while len(self.pending) >= 2:
            self._finish_oldest()
        shift = _Shift(self.group, 2 + 2 * j)  # tags per head group: at most one exchange of a group in flight
        shift.start(self.sums[j])
        self.pending.append((j, shift))

    def take(self, j):
        """The sums of group j of the block now held (received from rank-1)."""
        while any(i == j for i, _ in self.pending):
            self._finish_oldest()
        return self.sums[j]

    def _finish_oldest(self):
        i, shift = self.pending.popleft()
        self.sums[i] = tuple(shift.wait())


def ring_backward(dout, q, k, v, out, lse, lay, group):
    """(dq, dk, dv) of this rank's shards: dq from every rank's keys, dk and dv from every
    rank's queries. The library's backward adds each block's gradients straight into dq and
    into the dK/dV sums that travel with the block (flashattn_plan_set_grad_accumulate):
    one fp32 addition rounded once per block, and no per-block gradient buffers."""
    world = lay.world
    kv_shift = _Shift(group, 0)
    dq = torch.empty_like(q)
    sums = _Sums(k, v, lay.groups, group)
    kv = (k, v)
    for step in range(world):
        last = step + 1 == world
        if not last:
            kv_shift.start(kv)
        rows, cols, opts = lay.block(step)
        o_r, do_r = _rows(out, rows), _rows(dout, rows)
        for j, (qh, kh) in enumerate(lay.groups):
            dk_j, dv_j = sums.take(j)
            # Step 0 is the diagonal block: it writes every row of dq and every key of the sums.
            P.backward_into(do_r[:, :, qh], _rows(q, rows)[:, :, qh], _rows(kv[0], cols)[:, :, kh],
                            _rows(kv[1], cols)[:, :, kh], o_r[:, :, qh], _rows(lse, rows, 2)[:, qh].contiguous(),
                            _rows(dq, rows)[:, :, qh], _rows(dk_j, cols), _rows(dv_j, cols), opts, step > 0)
            if world > 1:
                sums.send_on(j)
        if not last:
            kv = tuple(kv_shift.wait())
    del kv, dk_j, dv_j, o_r, do_r  # the last block and views of it: free before dk and dv exist
    # After the last step the sums have gone round the ring once more: this rank's own.
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    for j, (_, kh) in enumerate(lay.groups):
        dk[:, :, kh].copy_(sums.take(j)[0])
        dv[:, :, kh].copy_(sums.take(j)[1])
        sums.sums[j] = None
    return dq, dk, dv


class _RingAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, softcap, deterministic, group):
        lay = _Layout(q.shape[1], q.shape[2], k.shape[2], dist.get_rank(group), dist.get_world_size(group), causal,
                      scale, softcap, deterministic)
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
