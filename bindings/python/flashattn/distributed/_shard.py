"""Zig-zag sharding of a sequence over the ranks of a ring: rank r of W holds chunks r and
2W-1-r of 2W equal chunks, so under a causal mask every rank has the same amount of work."""
from __future__ import annotations

import torch

from .._lib import Status, make_error


def _chunks(n, world_size, what, dim):
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise make_error(Status.INVALID_ARGUMENT, "world_size=%r must be a positive integer" % (world_size,))
    if n % (2 * world_size):
        raise make_error(Status.INVALID_SHAPE, "%s has %d tokens along dim %d; zig-zag sharding over %d ranks needs "
                         "a multiple of 2*world_size=%d" % (what, n, dim, world_size, 2 * world_size))
    return n // (2 * world_size)


def zigzag_shard(x, rank, world_size, dim=1):
    """Rank `rank`'s shard of the full sequence x (tokens along `dim`, default 1 as in
    (batch, seq, heads, dim)): chunks rank and 2*world_size-1-rank of 2*world_size equal
    chunks, concatenated. The length must be a multiple of 2*world_size."""
    c = _chunks(x.shape[dim], world_size, "x", dim)
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise make_error(Status.INVALID_ARGUMENT, "rank=%r is not in [0, world_size=%d)" % (rank, world_size))
    first = x.narrow(dim, rank * c, c)
    second = x.narrow(dim, (2 * world_size - 1 - rank) * c, c)
    return torch.cat([first, second], dim)


def zigzag_unshard(shards, dim=1):
    """The full sequence from every rank's zig-zag shard, in rank order (the inverse of
    :func:`zigzag_shard`)."""
    shards = list(shards)
    if not shards:
        raise make_error(Status.INVALID_ARGUMENT, "shards is empty; pass one shard per rank")
    n = shards[0].shape[dim]
    for r, s in enumerate(shards):
        if s.shape != shards[0].shape:
            raise make_error(Status.INVALID_SHAPE, "shards[%d] has shape %s; shards[0] has %s (every rank holds "
                             "the same number of tokens)" % (r, tuple(s.shape), tuple(shards[0].shape)))
    if n % 2:
        raise make_error(Status.INVALID_SHAPE, "shards have %d tokens along dim %d; a zig-zag shard holds two equal "
                         "chunks" % (n, dim))
    c = n // 2
    firsts = [s.narrow(dim, 0, c) for s in shards]
    seconds = [s.narrow(dim, c, c) for s in reversed(shards)]
    return torch.cat(firsts + seconds, dim)


def zigzag_gather(x, group=None, dim=1):
    """The full sequence on every rank of `group` (default: the whole world) from this
    rank's zig-zag shard x (an all_gather, then :func:`zigzag_unshard`)."""
    import torch.distributed as dist
    shards = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(shards, x.contiguous(), group=group)
    return zigzag_unshard(shards, dim)

