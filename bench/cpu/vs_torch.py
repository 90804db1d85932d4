#!/usr/bin/env python3
"""libflashattn's CPU backend beside PyTorch's CPU scaled_dot_product_attention, in one process.

Times, for every (dtype, head_dim, N, causal, pass) of the sweep, the library's FLASH
algorithm, its STANDARD algorithm and torch.nn.functional.scaled_dot_product_attention
on the same inputs and the same number of threads (FLASHATTN_CPU_THREADS for the
library's plans, torch.set_num_threads for torch), and appends one row per algorithm to
bench/results/cpu.csv:
  host,threads,dtype,d,N,causal,pass,ours_gflops,torch_gflops,commit,date
pass is fwd, fwd+bwd or decode (1 query against N keys, forward), with ":standard"
appended for the STANDARD rows. GFLOP/s count 4*B*H*Nq*Nk*d for a forward (half of it
under a causal mask) and 3.5 times that for forward+backward, for both libraries. Each
figure is the fastest of --repeats calls (after a warm-up), the implementations' calls
alternated round by round, so a burst of other load on a shared machine falls on both.
Each timed call of the sweep starts --gap seconds (default 0.05) after the call before it
(--tiny times back to back): torch's OpenMP (libgomp) threads spin for a few milliseconds
after each parallel region, and without the gap they spun on the cores through the
library's next call (docs/internals/cpu-bf16-amx.md); torch keeps its default wait policy,
under which its own calls run fastest.

usage: vs_torch.py [--lib PATH] [--threads N] [--batch B] [--heads H] [--heads-kv HK] [--dims 64,128]
                   [--n 1024,2048,4096] [--decode 4096,8192,16384,32768]
                   [--dtypes fp32,bf16] [--passes fwd,fwd+bwd] [--repeats R] [--gap S]
                   [--no-standard] [--csv PATH] [--host NAME] [--budget SECONDS]
  --tiny  instead of the sweep: microseconds per forward of b=1, one query, 128 keys (and
          larger key counts) with 1 and 2 threads: the small-problem cutoff's check.
Each row is appended (and flushed) as soon as it is measured, so a run stopped at a time
limit keeps the rows it finished; --budget stops starting new cases once that many
seconds have passed (the cases left are listed). Inputs are BSHD for the library and
BHSD (torch's own layout) for torch; bf16 runs use bf16 inputs in both. --heads-kv
(default: --heads) gives K and V fewer heads than Q (grouped-query attention; torch runs
it with enable_gqa); the rows' host column then ends in "/gqa<H>:<HK>" so they never mix
with rows of equal heads. Needs torch; the library is found as the Python binding finds
it (FLASHATTN_LIBRARY, or --lib). Outside a git checkout (a copied tree), name the commit
in FLASHATTN_COMMIT.
"""
import argparse
import ctypes
import datetime
import os
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "bindings", "python"))
sys.path.insert(0, os.path.join(REPO, "bench"))

import torch  # noqa: E402
from suite import report  # noqa: E402

COLUMNS = "host,threads,dtype,d,N,causal,pass,ours_gflops,torch_gflops,commit,date"
DTYPES = {"fp32": (torch.float32, 2), "bf16": (torch.bfloat16, 1)}  # flashattn_dtype_t values
FLASH, STANDARD = 0, 1  # flashattn_algorithm_t
PASS_FWD, PASS_BWD = 0, 1  # flashattn_pass_t
ALIGN_TOP_LEFT = 0  # torch's is_causal: query i sees keys 0..i


def library(path):
    if path:
        os.environ["FLASHATTN_LIBRARY"] = path
    from flashattn import _lib
    return _lib, _lib.lib()


def check(lib, status, what):
    if status != 0:
        raise RuntimeError("%s: status %d: %s" % (what, status, lib.flashattn_last_error().decode()))


class Plan:
    """A CPU plan of one problem with its workspace; threads fixed at creation."""

    def __init__(self, fa, lib, threads, b, h, hkv, nq, nk, d, dtype_code, causal, algorithm):
        self.fa, self.lib = fa, lib
        os.environ["FLASHATTN_CPU_THREADS"] = str(threads)
        self.plan = ctypes.c_void_p()
        check(lib, lib.flashattn_plan_create(ctypes.byref(self.plan), 1, 0), "plan_create")
        check(lib, lib.flashattn_plan_set_shape(self.plan, b, nq, nk, h, hkv, d, d), "set_shape")
        check(lib, lib.flashattn_plan_set_dtype(self.plan, dtype_code), "set_dtype")
        check(lib, lib.flashattn_plan_set_algorithm(self.plan, algorithm), "set_algorithm")
        if causal:
            check(lib, lib.flashattn_plan_set_band_mask(self.plan, ALIGN_TOP_LEFT, -1, 0), "set_band_mask")
        sizes = []
        for p in (PASS_FWD, PASS_BWD):
            n = ctypes.c_size_t()
            check(lib, lib.flashattn_plan_get_workspace_size(self.plan, p, ctypes.byref(n)), "workspace")
            sizes.append(n.value)
        self.ws = torch.empty(max(sizes) + 64, dtype=torch.uint8)
        self.ws_ptr = (self.ws.data_ptr() + 63) // 64 * 64
        self.ws_bytes = max(sizes)

    def fwd(self, q, k, v, o, lse):
        a = self.fa.FwdArgs(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(), lse=lse.data_ptr())
        check(self.lib, self.lib.flashattn_fwd(self.plan, ctypes.byref(a), self.ws_ptr, self.ws_bytes, None), "fwd")

    def bwd(self, q, k, v, o, lse, do, dq, dk, dv):
        a = self.fa.BwdArgs(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(), lse=lse.data_ptr(),
                            dout=do.data_ptr(), dq=dq.data_ptr(), dk=dk.data_ptr(), dv=dv.data_ptr())
        check(self.lib, self.lib.flashattn_bwd(self.plan, ctypes.byref(a), self.ws_ptr, self.ws_bytes, None), "bwd")

    def close(self):
        self.lib.flashattn_plan_destroy(self.plan)


def best_seconds(fns, repeats, gap=0.05):
    """Fastest of `repeats` timed calls of each of fns after a warm-up, the calls
    alternated round by round (ours, torch, ours, ...) so that a burst of other load on
    a shared machine falls on both sides alike; the other load only ever adds time, so
    the minimum is the least disturbed estimate. Each timed call starts `gap` seconds after
    the one before, once the other side's spinning threads have gone to sleep."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, t_fn in zip(fns, times):
            time.sleep(gap)
            t = time.perf_counter()
            fn()
            t_fn.append(time.perf_counter() - t)
    return [min(t_fn) for t_fn in times]


def flops(b, h, nq, nk, d, causal, passname):
    f = 4.0 * b * h * nq * nk * d
    if causal:
        f /= 2
    return f * 3.5 if passname == "fwd+bwd" else f


def ours_step(fa, lib, args, algorithm, x, passname):
    """(one call of the library's pass, a function that frees its plan)."""
    b, h, hkv, nq, nk, d, dtype_code, causal, threads = args
    plan = Plan(fa, lib, threads, b, h, hkv, nq, nk, d, dtype_code, causal, algorithm)
    q, k, v, do = x
    o, dq, dk, dv = torch.empty_like(q), torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    lse = torch.empty(b * h * nq, dtype=torch.float32)
    if passname == "fwd+bwd":
        def step():
            plan.fwd(q, k, v, o, lse)
            plan.bwd(q, k, v, o, lse, do, dq, dk, dv)
    else:
        def step():
            plan.fwd(q, k, v, o, lse)
    return step, plan.close


def torch_step(x, causal, passname):
    """One call of torch's CPU SDPA on the same inputs (BHSD copies)."""
    q, k, v, do = (t.transpose(1, 2).contiguous() for t in x)  # BSHD -> BHSD
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    sdpa = lambda *a, **kw: torch.nn.functional.scaled_dot_product_attention(*a, **kw, **gqa)  # noqa: E731
    if passname == "fwd+bwd":
        q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)

        def step():
            q.grad = k.grad = v.grad = None
            sdpa(q, k, v, is_causal=causal).backward(do)
    else:
        def step():
            with torch.no_grad():
                sdpa(q, k, v, is_causal=causal)
    return step


def time_case(fa, lib, args, x, passname, o):
    """Seconds of (ours, the standard algorithm or None, torch), timed alternately."""
    made = [ours_step(fa, lib, args, FLASH, x, passname)]
    if o.standard:
        made.append(ours_step(fa, lib, args, STANDARD, x, passname))
    try:
        times = best_seconds([step for step, _ in made] + [torch_step(x, args[7], passname)], o.repeats, o.gap)
    finally:
        for _, close in made:
            close()
    return times[0], (times[1] if o.standard else None), times[-1]


def sweep(fa, lib, o, emit):
    """Measures the cases of o and passes each row to emit as soon as it is measured."""
    torch.set_num_threads(o.threads)
    start = time.monotonic()
    cases = []
    for dt in o.dtypes:
        for d in o.dims:
            for n in o.n:
                for causal in (False, True):
                    for p in o.passes:
                        cases.append((dt, d, 1, n, causal, p))
            for n in o.decode:
                cases.append((dt, d, 1, n, False, "decode"))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    print("%-5s %4s %6s %6s %-8s %10s %10s %10s %6s" % ("dtype", "d", "N", "causal", "pass", "ours", "standard",
                                                         "torch", "ratio"))
    for index, (dt, d, nq0, n, causal, p) in enumerate(cases):
        if o.budget is not None and time.monotonic() - start > o.budget:
            left = ["%s d=%d N=%d causal=%d %s" % (c[0], c[1], c[3], c[4], c[5]) for c in cases[index:]]
            print("budget of %g s spent: %d cases not run: %s" % (o.budget, len(left), "; ".join(left)))
            break
        torch_dtype, code = DTYPES[dt]
        nq = 1 if p == "decode" else n
        b, h, hkv = o.batch, o.heads, o.heads_kv
        torch.manual_seed(0)
        x = tuple(torch.randn(b, s, hs, d).to(torch_dtype) for s, hs in ((nq, h), (n, hkv), (n, hkv), (nq, h)))
        passname = "fwd" if p == "decode" else p
        args = (b, h, hkv, nq, n, d, code, causal, o.threads)
        f = flops(b, h, nq, n, d, causal, passname)
        t_ours, t_std, t_ref = time_case(fa, lib, args, x, passname, o)
        ours, ref = f / t_ours / 1e9, f / t_ref / 1e9
        std = f / t_std / 1e9 if t_std is not None else None
        print("%-5s %4d %6d %6s %-8s %10.2f %10s %10.2f %6.2f" % (dt, d, n, causal, p, ours,
                                                                   "%.2f" % std if std else "-", ref, ours / ref),
              flush=True)
        host = o.host if hkv == h else "%s/gqa%d:%d" % (o.host, h, hkv)
        base = [host, o.threads, dt, d, n, int(causal)]
        emit(base + [p, "%.3f" % ours, "%.3f" % ref, o.commit, stamp])
        if std is not None:
            emit(base + [p + ":standard", "%.3f" % std, "%.3f" % ref, o.commit, stamp])


def tiny(fa, lib, o):
    print("microseconds per forward, b=1, h=%d, one query, d=64, fp32 (best of %d)" % (o.heads, o.repeats))
    print("%6s %10s %10s" % ("keys", "1 thread", "2 threads"))
    for nk in (128, 512, 2048, 8192):
        x = tuple(torch.randn(1, s, o.heads, 64) for s in (1, nk, nk, 1))
        made = [ours_step(fa, lib, (1, o.heads, o.heads, 1, nk, 64, 2, False, t), FLASH, x, "fwd") for t in (1, 2)]
        try:
            us = [t * 1e6 for t in best_seconds([step for step, _ in made], o.repeats, 0.0)]
        finally:
            for _, close in made:
                close()
        print("%6d %10.1f %10.1f" % (nk, us[0], us[1]), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ints = lambda s: [int(v) for v in s.split(",") if v]  # noqa: E731

    def non_negative(s):
        v = float(s)
        if not v >= 0:
            raise argparse.ArgumentTypeError("--gap=%s: expected seconds >= 0" % s)
        return v

    ap.add_argument("--lib")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--heads-kv", dest="heads_kv", type=int, default=None)
    ap.add_argument("--dims", type=ints, default=[64, 128])
    ap.add_argument("--n", type=ints, default=[1024, 2048, 4096])
    ap.add_argument("--decode", type=ints, default=[4096, 8192, 16384, 32768])
    ap.add_argument("--dtypes", type=lambda s: s.split(","), default=["fp32", "bf16"])
    ap.add_argument("--passes", type=lambda s: s.split(","), default=["fwd", "fwd+bwd"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gap", type=non_negative, default=0.05)
    ap.add_argument("--no-standard", dest="standard", action="store_false")
    ap.add_argument("--csv", default=os.path.join(REPO, "bench", "results", "cpu.csv"))
    ap.add_argument("--host", default=socket.gethostname())
    ap.add_argument("--budget", type=float, default=None)
    ap.add_argument("--tiny", action="store_true")
    o = ap.parse_args()
    if o.heads_kv is None:
        o.heads_kv = o.heads
    if o.heads_kv < 1 or o.heads % o.heads_kv:
        ap.error("--heads-kv=%d must divide --heads=%d" % (o.heads_kv, o.heads))
    o.commit = report.commit()
    fa, lib = library(o.lib)
    if o.tiny:
        tiny(fa, lib, o)
        return
    new = not os.path.exists(o.csv)
    with open(o.csv, "a") as f:
        if new:
            f.write(COLUMNS + "\n")
        rows = []

        def emit(row):
            f.write(",".join(str(c) for c in row) + "\n")
            f.flush()
            rows.append(row)

        sweep(fa, lib, o, emit)
    print("appended %d rows to %s" % (len(rows), o.csv))


if __name__ == "__main__":
    main()
