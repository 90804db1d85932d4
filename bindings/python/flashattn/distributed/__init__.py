"""flashattn.distributed: context parallelism over torch.distributed.

    import torch.distributed as dist
    from flashattn.distributed import ring_attention, zigzag_shard, zigzag_gather
    r, w = dist.get_rank(), dist.get_world_size()
    q, k, v = (zigzag_shard(t, r, w) for t in (q_full, k_full, v_full))   # (batch, seq/w, heads, dim)
    out = ring_attention(q, k, v, causal=True)                           # this rank's shard of the output
    out.sum().backward()

See docs/distributed.md.
"""
from ._ring import ring_attention
from ._shard import zigzag_gather, zigzag_shard, zigzag_unshard

__all__ = ["ring_attention", "zigzag_gather", "zigzag_shard", "zigzag_unshard"]
