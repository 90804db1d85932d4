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
    return time_cuda_rounds(torch, {"": fn}, min_iters, max_iters, target_s)[""]


def time_cuda_rounds(torch, fns, min_iters=5, max_iters=50, target_s=0.4):
    """Median milliseconds of each of fns (name -> function of no arguments), timed in
    rounds: every round calls each function once, each call between two CUDA events, and
    each round starts at the next function. So every implementation of a comparison runs
    in the same power and clock state: timed one after the other, the one timed after a
    pause (a peer building its plan on its first call) ran at a higher clock than the one
    timed under sustained load (docs/internals/measurement-method.md). Each function gets
    about target_s of timed calls, min_iters..max_iters of them."""
    names = list(fns)
    est = {}
    for n in names:
        fns[n]()  # warm-up (also lazy init: cuBLAS, cuDNN plans)
    torch.cuda.synchronize()
    for n in names:
        t0 = time.perf_counter()
        fns[n]()
        torch.cuda.synchronize()
        est[n] = max(time.perf_counter() - t0, 1e-5)
    per_round = sum(est.values())
    for _ in range(2 if per_round < 0.05 * len(names) else 0):
        for n in names:
            fns[n]()
    iters = int(min(max_iters, max(min_iters, target_s * len(names) / per_round)))
    evs = {n: [] for n in names}
    for i in range(iters):
        for j in range(len(names)):
            n = names[(i + j) % len(names)]
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fns[n]()
            e1.record()
            evs[n].append((e0, e1))
    torch.cuda.synchronize()
    return {n: statistics.median(e0.elapsed_time(e1) for e0, e1 in evs[n]) for n in names}


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


def torch_calls(torch, name, q, k, v, do, causal, directions):
    """SDPA backend `name`'s passes in `directions` on BSHD q, k, v, do (see sdpa_call):
    direction -> function of no arguments, each call made under that backend."""
    from torch.nn.attention import sdpa_kernel
    backend = [sdpa_backend(torch, name)]

    def under(fn):
        def call():
            with sdpa_kernel(backend):
                fn()
        return call
    with sdpa_kernel(backend):
        return {d: under(sdpa_call(torch, q, k, v, do, causal, d)) for d in ("fwd", "bwd") if d in directions}
