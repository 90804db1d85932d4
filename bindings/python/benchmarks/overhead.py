"""Per-call cost of flashattn.attention beside torch SDPA, in one process.

    python3 bindings/python/benchmarks/overhead.py --device cuda     # the issue's target
    python3 bindings/python/benchmarks/overhead.py --device cpu      # binding overhead only
    python3 bindings/python/benchmarks/overhead.py --varlen          # packed, as flash_attn_varlen_func

At a tiny shape the kernels take microseconds, so the time per call is the host path:
Python, the dispatcher, allocation and the launch. Each row is the mean over --iters
calls issued back to back (one device synchronization at the end of each timed run),
the best of --repeats runs. Rows:

  c_call       flashattn_fwd/flashattn_bwd through ctypes with preallocated outputs
               (the floor the binding adds to)
  flashattn    flashattn.attention on the Python path (plan cache, outputs from torch)
  fa_ext       flashattn.attention through the compiled extension (flashattn.torch_ext),
               when it is built: timed alternately with the Python path
  sdpa         torch.nn.functional.scaled_dot_product_attention, (batch, heads, seq, dim)

"fwd" runs without autograd; "fwd+bwd" runs forward and backward on inputs that
require grad. The ratio column is flashattn / sdpa (the target is <= 1.2). With --varlen
flashattn's rows take the batch packed (tokens, heads, dim) with cu_seqlens of equal
lengths on the device and the max lengths given (SDPA, which has no varlen form, runs on
the padded batch: the same tokens).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flashattn  # noqa: E402
from flashattn import _torch_plans, torch_ext  # noqa: E402


def _timed(runs, iters, repeats, sync):
    """Best mean time per call (us) of each (setup, fn) of runs, the runs alternated."""
    best = [float("inf")] * len(runs)
    for _ in range(repeats):
        for i, (setup, fn) in enumerate(runs):
            setup()
            sync()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            sync()
            best[i] = min(best[i], (time.perf_counter() - t0) / iters)
    return [b * 1e6 for b in best]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="float16, bfloat16 or float32 (default: bf16 on CUDA, fp32 on CPU)")
    ap.add_argument("--shape", default="1,16,2,64", help="batch,seqlen,heads,head_dim (default 1,16,2,64)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="attention dropout probability of every row (the seed drawn per call, as in training)")
    ap.add_argument("--varlen", action="store_true",
                    help="flashattn's rows on the batch packed with cu_seqlens (equal lengths, max lengths given)")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-ext", dest="ext", action="store_false",
                    help="leave out the compiled extension's rows (flashattn.torch_ext), even when it is built")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    b, s, h, d = (int(x) for x in a.shape.split(","))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    q, k, v = (torch.randn(b, s, h, d, device=dev, dtype=dtype) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # SDPA's (batch, heads, seq, dim) view, same memory
    gqt, gkt, gvt = (x.detach().transpose(1, 2).clone().requires_grad_(True) for x in (q, k, v))
    do = torch.randn_like(q)
    dot = do.transpose(1, 2)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    kw, cu = {}, None
    if a.varlen:  # flashattn's inputs packed (tokens, heads, dim), same memory
        cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=dev)
        kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=s, max_seqlen_k=s)
        q, k, v, do = (x.view(b * s, h, d) for x in (q, k, v, do))
    gq, gk, gv = (x.clone().requires_grad_(True) for x in (q, k, v))

    # The C floor: the cached plan of these tensors, outputs allocated once.
    opts = (s if a.varlen else 0, s if a.varlen else 0, -1, 0 if a.causal else -1, False, 0.0, 0.0, False, a.dropout,
            0, 0, False, 0)
    e = _torch_plans.entry(q, k, v, None, None, cu, cu, None, opts)
    rng = torch.zeros(2, dtype=torch.int64) if a.dropout else None  # the floor keeps one seed
    out, lse = _torch_plans.forward(q, k, v, None, None, cu, cu, None, rng, opts, True)
    cu_ptr = 0 if cu is None else cu.data_ptr()
    fargs = _torch_plans._FWD_ARGS.pack(_torch_plans._FWD_SIZE, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                        out.data_ptr(), lse.data_ptr(), 0, 0, cu_ptr, cu_ptr)
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    bargs = _torch_plans._BWD_ARGS.pack(_torch_plans._BWD_SIZE, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                        out.data_ptr(), lse.data_ptr(), do.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                        dv.data_ptr(), 0, 0, 0, cu_ptr, cu_ptr)
    wsf = torch.empty(max(e.ws_fwd, 1), dtype=torch.uint8, device=dev)
    wsb = torch.empty(max(e.ws_bwd, 1), dtype=torch.uint8, device=dev)
    cf, cb = _torch_plans._cfunc("flashattn_fwd"), _torch_plans._cfunc("flashattn_bwd")
    stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else None

    def c_fwd():
        cf(e.handle, fargs, wsf.data_ptr(), e.ws_fwd, stream)

    def c_fwdbwd():
        cf(e.handle, fargs, wsf.data_ptr(), e.ws_fwd, stream)
        cb(e.handle, bargs, wsb.data_ptr(), e.ws_bwd, stream)

    def fa_fwd():
        with torch.no_grad():
            flashattn.attention(q, k, v, causal=a.causal, dropout_p=a.dropout, **kw)

    def sdpa_fwd():
        with torch.no_grad():
            sdpa(qt, kt, vt, is_causal=a.causal, dropout_p=a.dropout)

    def fa_fwdbwd():
        flashattn.attention(gq, gk, gv, causal=a.causal, dropout_p=a.dropout, **kw).backward(do)

    def sdpa_fwdbwd():
        sdpa(gqt, gkt, gvt, is_causal=a.causal, dropout_p=a.dropout).backward(dot)

    ext = a.ext and torch_ext.load()
    python_path, ext_path = torch_ext.disable, (torch_ext.load if ext else None)
    rows = []
    for p in ("fwd", "fwd+bwd"):
        group = [("c_call", python_path, c_fwd if p == "fwd" else c_fwdbwd),
                 ("flashattn", python_path, fa_fwd if p == "fwd" else fa_fwdbwd),
                 ("sdpa", python_path, sdpa_fwd if p == "fwd" else sdpa_fwdbwd)]
        if ext:
            group.insert(2, ("fa_ext", ext_path, fa_fwd if p == "fwd" else fa_fwdbwd))
        for _, setup, fn in group:
            setup()
            for _ in range(20):
                fn()  # warm-up: plan cache, allocator, kernels
        times = _timed([(setup, fn) for _, setup, fn in group], a.iters, a.repeats, sync)
        rows += [(name + " " + p, us) for (name, _, _), us in zip(group, times)]
    t = dict(rows)
    dev_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print("device %s, dtype %s, shape (b, s, h, d) = %s%s, causal=%s, dropout %g, torch %s, %s" % (
        dev_name, str(dtype).replace("torch.", ""), (b, s, h, d), " packed (varlen)" if a.varlen else "", a.causal,
        a.dropout, torch.__version__, flashattn.library_path()))
    print("%-20s %10s %8s" % ("", "us/call", "vs sdpa"))
    for name, us in rows:
        peer = "sdpa " + name.split(" ", 1)[1]
        print("%-20s %10.1f %8s" % (name, us, "%.2fx" % (us / t[peer]) if name.startswith("f") else ""))
    for name in ("flashattn", "fa_ext") if ext else ("flashattn",):
        print("%s overhead over the C call: fwd %.1f us, fwd+bwd %.1f us" % (
            name, t[name + " fwd"] - t["c_call fwd"], t[name + " fwd+bwd"] - t["c_call fwd+bwd"]))
    if not ext:
        print("compiled extension: off (%s)" % torch_ext.status()["reason"])


if __name__ == "__main__":
    main()
