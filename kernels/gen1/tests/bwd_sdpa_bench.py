"""PyTorch SDPA (flash = FlashAttention-2, cudnn) BACKWARD timings for the shapes that
kernels/gen1/tests/bwd_harness.cu times; run in the same device session to compare.
Times torch.autograd.grad of one forward's output (backward only)."""
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(d, s, c) for d in (64, 128, 256) for s in (1024, 4096, 16384) for c in (False, True)]
SHAPES.append((128, 512, False))
# BWD_BENCH_MIN_SEQ=N: only the shapes with seqlen >= N (as the harness).
SHAPES = [sh for sh in SHAPES if sh[1] >= int(os.environ.get("BWD_BENCH_MIN_SEQ", "0"))]


def bench(fn, reps=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    ts.sort()
    return ts[len(ts) // 2]


for d, s, causal in SHAPES:
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
               for _ in range(3))
    do = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
    for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(be):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                ms = bench(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
            print(f"BENCH sdpa-{name}-bwd d={d} seq={s} {'causal' if causal else 'noncausal'}: {ms:.3f} ms  "
                  f"{flops / ms / 1e9:.1f} TFLOP/s")
            del out
        except Exception as e:  # backend unavailable for this shape
            print(f"BENCH sdpa-{name}-bwd d={d} seq={s}: unavailable ({type(e).__name__}: {e})"[:200])
