"""PyTorch SDPA (flash = FlashAttention-2, cudnn) BACKWARD timings for the shapes that
kernels/gen1/tests/bwd_harness.cu times; run in the same device session to compare.
Times torch.autograd.grad of one forward's output (backward only), with bench/bench_peers.py's
own SDPA call and timer (BSHD tensors, dO too, so SDPA copies nothing; CUDA events around
back-to-back calls, no synchronization between them), so its figures match that benchmark's."""
import os
import sys

import torch
from torch.nn.attention import sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "bench"))
from bench_peers import flops, sdpa_backend, sdpa_call, time_cuda  # noqa: E402

SHAPES = [(d, s, c) for d in (64, 128, 256) for s in (1024, 4096, 16384) for c in (False, True)]
SHAPES.append((128, 512, False))
# BWD_BENCH_MIN_SEQ=N: only the shapes with seqlen >= N (as the harness).
SHAPES = [sh for sh in SHAPES if sh[1] >= int(os.environ.get("BWD_BENCH_MIN_SEQ", "0"))]

for d, s, causal in SHAPES:
    b, h = 16384 // s, 2048 // d
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    f = flops(b, h, s, s, d, causal, "bwd")
    for name in ("flash", "cudnn"):
        try:
            with sdpa_kernel(sdpa_backend(torch, name)):
                ms = time_cuda(torch, sdpa_call(torch, q, k, v, do, causal, "bwd"))
            print(f"BENCH sdpa-{name}-bwd d={d} seq={s} {'causal' if causal else 'noncausal'}: {ms:.3f} ms  "
                  f"{f / ms / 1e9:.1f} TFLOP/s")
        except Exception as e:  # backend unavailable for this shape
            print(f"BENCH sdpa-{name}-bwd d={d} seq={s}: unavailable ({type(e).__name__}: {e})"[:200])
    del q, k, v, do
