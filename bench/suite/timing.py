"""How one call is timed, and the peers: PyTorch SDPA's backends on the same tensors.

Conventions (bench/README.md): FLOPs fwd 2*b*h*sq*sk*(d_qk + d_v) (4*b*h*sq*sk*d where the
head dims are equal), halved for causal, backward 2.5x the forward; CUDA events around each
call after warm-up, median of the timed calls.
"""
import statistics
import time

SDPA = ["flash", "cudnn", "efficient", "math"]


def flops(b, h, sq, sk, d, causal, direction, dv=None):
    f = 2.0 * b * h * sq * sk * (d + (d if dv is None else dv))
    if causal:
        f /= 2
    return f * (2.5 if direction == "bwd" else 1.0)


def parse_hdims(text):
    """--hdims: a comma list of head dims, each d (d_qk = d_v) or d_qk/d_v; [(d_qk, d_v), ...]."""
    dims = []
    for x in text.split(","):
        if x:
            qk, _, v = x.partition("/")
            dims.append((int(qk), int(v or qk)))
    return dims


def hdim_label(d, dv):
    """The hdim column of a row: d where d_qk = d_v, else "d_qk/d_v"."""
    return d if d == dv else f"{d}/{dv}"


def hdim_order(label):
    """Sort key of hdim column values (ints and "d_qk/d_v" strings): (d_qk, d_v)."""
    qk, _, v = str(label).partition("/")
    return int(qk), int(v or qk)


def time_cuda(torch, fn, min_iters=5, max_iters=50, target_s=0.4):
    """Median milliseconds of fn over back-to-back CUDA-event-bracketed calls."""
    fn()  # warm-up (also lazy init: cuBLAS, cuDNN plans)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    est = max(time.perf_counter() - t0, 1e-5)
    for _ in range(2 if est < 0.05 else 0):
        fn()
    iters = int(min(max_iters, max(min_iters, target_s / est)))
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for e0, e1 in evs:
        e0.record()
        fn()
        e1.record()
    torch.cuda.synchronize()
    return statistics.median(e0.elapsed_time(e1) for e0, e1 in evs)


def short(e, n=150):
    s = str(e).replace("\n", " ")
    return s if len(s) <= n else s[:n - 3] + "..."


def sdpa_backend(torch, name):
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]


def sdpa_call(torch, q, k, v, do, causal, direction):
    """One SDPA call as a function of no arguments, to run under the caller's sdpa_kernel
    context: the forward without autograd, or ("bwd") the backward of a forward made here
    once. q, k, v, do: BSHD tensors; SDPA sees [b, h, s, d] views of the same memory."""
    import torch.nn.functional as F
    qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, do))
    if direction == "fwd":
        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        return fwd
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (qt, kt, vt))
    out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
    return lambda: torch.autograd.grad(out, (qg, kg, vg), dot, retain_graph=True)


def bench_torch(torch, name, q, k, v, do, causal, directions):
    """Times SDPA backend `name` on BSHD q, k, v, do (see sdpa_call)."""
    from torch.nn.attention import sdpa_kernel
    res = {}
    with sdpa_kernel([sdpa_backend(torch, name)]):
        for direction in ("fwd", "bwd"):
            if direction in directions:
                res[direction] = time_cuda(torch, sdpa_call(torch, q, k, v, do, causal, direction))
    return res
