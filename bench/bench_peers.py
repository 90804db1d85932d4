#!/usr/bin/env python3
"""libflashattn against its peers, in one process, on the same inputs.

Runs the library (FLASH and STANDARD algorithms, through its C ABI with ctypes) and
PyTorch SDPA's flash / cudnn / efficient / math backends on identical tensors:
  * throughput sweep: bf16/fp16, head dims 64/128/256, causal or not, seqlen 512..16k at
    16k tokens per batch (b = 16384/sq, h = 2048/d), forward and backward; TFLOP/s with
    the peers' convention (fwd 4*b*h*sq*sk*d, halved for causal; bwd 2.5x the forward),
    CUDA events around each call, warm-up, median of many runs;
  * peak memory of flash vs standard attention (and PyTorch) at a long sequence length;
  * block-sparse runtime against layout density (seqlen 8k, blocks 128x128).
Optionally (--verify) checks the library's CUDA results first: against an fp64 reference
for dense problems and against the library's own CPU backend for every option.

Writes <out>/bench.csv, bench.json, bench.png (if matplotlib is importable) and prints a
compact table with ratios vs PyTorch flash and cuDNN last. A library error (e.g. a
configuration a kernel does not support) is reported in its row; the sweep goes on.

The ctypes declarations are written here on purpose (no dependency on bindings/python).
"""
import argparse
import csv
import ctypes
import json
import math
import os
import random
import statistics
import sys
import time

# ----------------------------------------------------------------------------- C ABI
c_i64 = ctypes.c_int64
c_vp = ctypes.c_void_p

STATUS_SUCCESS = 0
BACKEND_CPU, BACKEND_CUDA = 1, 2
DTYPE = {"fp16": 0, "bf16": 1, "fp32": 2}
ALGO_FLASH, ALGO_STANDARD = 0, 1
PASS_FWD, PASS_BWD = 0, 1
ALIGN_TOP_LEFT, ALIGN_BOTTOM_RIGHT = 0, 1
BIAS_NONE, BIAS_TENSOR, BIAS_ALIBI, BIAS_ALIBI_SYM = 0, 1, 2, 3
TENSOR = {"q": 0, "k": 1, "v": 2, "o": 3, "do": 4, "dq": 5, "dk": 6, "dv": 7}


class FwdArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("q", c_vp), ("k", c_vp), ("v", c_vp), ("o", c_vp),
                ("lse", c_vp), ("bias", c_vp), ("alibi_slopes", c_vp), ("cu_seqlens_q", c_vp),
                ("cu_seqlens_k", c_vp)]


class BwdArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("q", c_vp), ("k", c_vp), ("v", c_vp), ("o", c_vp),
                ("lse", c_vp), ("dout", c_vp), ("dq", c_vp), ("dk", c_vp), ("dv", c_vp), ("bias", c_vp),
                ("dbias", c_vp), ("alibi_slopes", c_vp), ("cu_seqlens_q", c_vp), ("cu_seqlens_k", c_vp)]


class LibError(RuntimeError):
    def __init__(self, status, name, message):
        super().__init__(f"{name}: {message}")
        self.status = status


def find_library(explicit=None):
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    cands = [explicit] if explicit else []
    if os.environ.get("FLASHATTN_LIB"):
        cands.append(os.environ["FLASHATTN_LIB"])
    cands += [os.path.join(root, d, "libflashattn.so.0") for d in sorted(os.listdir(root)) if d.startswith("build")]
    errors = []
    for c in cands:
        if os.path.exists(c):
            try:
                return ctypes.CDLL(c), c
            except OSError as e:
                errors.append(str(e))
    try:  # the dynamic loader's search path
        return ctypes.CDLL("libflashattn.so.0"), "libflashattn.so.0"
    except OSError as e:
        errors.append(str(e))
    raise OSError("cannot load libflashattn.so.0: " + "; ".join(errors))


class Lib:
    def __init__(self, path=None):
        self.dll, self.path = find_library(path)
        d = self.dll
        st = ctypes.c_int

        def sig(name, args, res=st):
            f = getattr(d, name)
            f.argtypes = args
            f.restype = res
            return f
        self.plan_create = sig("flashattn_plan_create", [ctypes.POINTER(c_vp), ctypes.c_int, ctypes.c_int])
        self.plan_destroy = sig("flashattn_plan_destroy", [c_vp], None)
        self.set_shape = sig("flashattn_plan_set_shape", [c_vp] + [c_i64] * 7)
        self.set_dtype = sig("flashattn_plan_set_dtype", [c_vp, ctypes.c_int])
        self.set_strides = sig("flashattn_plan_set_strides", [c_vp, ctypes.c_int, ctypes.POINTER(c_i64)])
        self.set_scale = sig("flashattn_plan_set_softmax_scale", [c_vp, ctypes.c_float])
        self.set_algorithm = sig("flashattn_plan_set_algorithm", [c_vp, ctypes.c_int])
        self.set_varlen = sig("flashattn_plan_set_varlen", [c_vp, ctypes.c_int, c_i64, c_i64])
        self.set_deterministic = sig("flashattn_plan_set_deterministic", [c_vp, ctypes.c_int])
        self.set_band = sig("flashattn_plan_set_band_mask", [c_vp, ctypes.c_int, c_i64, c_i64])
        self.set_softcap = sig("flashattn_plan_set_softcap", [c_vp, ctypes.c_float])
        self.set_bias = sig("flashattn_plan_set_bias", [c_vp, ctypes.c_int, ctypes.POINTER(c_i64)])
        self.set_dropout = sig("flashattn_plan_set_dropout", [c_vp, ctypes.c_float, ctypes.c_uint64, ctypes.c_uint64])
        self.set_block_sparse = sig("flashattn_plan_set_block_sparse",
                                    [c_vp, ctypes.POINTER(ctypes.c_uint8)] + [c_i64] * 5)
        self.ws_size = sig("flashattn_plan_get_workspace_size", [c_vp, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t)])
        self.fwd = sig("flashattn_fwd", [c_vp, ctypes.POINTER(FwdArgs), c_vp, ctypes.c_size_t, c_vp])
        self.bwd = sig("flashattn_bwd", [c_vp, ctypes.POINTER(BwdArgs), c_vp, ctypes.c_size_t, c_vp])
        self.last_error = sig("flashattn_last_error", [], ctypes.c_char_p)
        self.status_string = sig("flashattn_status_string", [ctypes.c_int], ctypes.c_char_p)
        self.device_count = sig("flashattn_cuda_device_count", [], ctypes.c_int)
        self.has_cuda = sig("flashattn_has_cuda_backend", [], ctypes.c_int)

    def check(self, status):
        if status != STATUS_SUCCESS:
            raise LibError(status, self.status_string(status).decode(), self.last_error().decode())


def i64s(vals):
    return (c_i64 * 4)(*vals)


class Plan:
    """A configured plan; options is a dict (see make_plan)."""

    def __init__(self, lib, backend, device=0):
        self.lib = lib
        self.h = c_vp()
        lib.check(lib.plan_create(ctypes.byref(self.h), backend, device))

    def __del__(self):
        if getattr(self, "h", None) and self.h.value:
            self.lib.plan_destroy(self.h)
            self.h = c_vp()

    def ws(self, pss):
        n = ctypes.c_size_t()
        self.lib.check(self.lib.ws_size(self.h, pss, ctypes.byref(n)))
        return n.value


def make_plan(lib, backend, b, sq, sk, hq, hkv, d, dv, dtype, algorithm=ALGO_FLASH, causal=False, opts=None):
    opts = opts or {}
    p = Plan(lib, backend)
    L = lib
    L.check(L.set_shape(p.h, b, sq, sk, hq, hkv, d, dv))
    L.check(L.set_dtype(p.h, DTYPE[dtype]))
    L.check(L.set_algorithm(p.h, algorithm))
    if "varlen" in opts:
        L.check(L.set_varlen(p.h, 1, opts["varlen"][0], opts["varlen"][1]))
    for name, strides in opts.get("strides", {}).items():
        L.check(L.set_strides(p.h, TENSOR[name], i64s(strides)))
    if causal:
        L.check(L.set_band(p.h, opts.get("align", ALIGN_TOP_LEFT), -1, 0))
    elif "window" in opts:
        L.check(L.set_band(p.h, opts.get("align", ALIGN_TOP_LEFT), opts["window"][0], opts["window"][1]))
    if opts.get("softcap"):
        L.check(L.set_softcap(p.h, opts["softcap"]))
    if "bias" in opts:
        kind, strides = opts["bias"]
        L.check(L.set_bias(p.h, kind, i64s(strides) if strides is not None else None))
    if opts.get("dropout"):
        L.check(L.set_dropout(p.h, opts["dropout"], 1234, 77))
    if opts.get("deterministic"):
        L.check(L.set_deterministic(p.h, 1))
    if "layout" in opts:
        lay, lh, nr, nc, bq, bk = opts["layout"]
        buf = (ctypes.c_uint8 * len(lay)).from_buffer_copy(bytes(lay))
        L.check(L.set_block_sparse(p.h, buf, lh, nr, nc, bq, bk))
    return p


def ptr(t):
    return None if t is None else t.data_ptr()


def stream_ptr(torch, backend):
    return torch.cuda.current_stream().cuda_stream if backend == BACKEND_CUDA else None


def lib_fwd(lib, plan, q, k, v, o, lse, ws, backend, torch, bias=None, slopes=None, cuq=None, cuk=None):
    a = FwdArgs(ctypes.sizeof(FwdArgs), ptr(q), ptr(k), ptr(v), ptr(o), ptr(lse), ptr(bias), ptr(slopes), ptr(cuq),
                ptr(cuk))
    lib.check(lib.fwd(plan.h, ctypes.byref(a), ptr(ws), 0 if ws is None else ws.numel(), stream_ptr(torch, backend)))


def lib_bwd(lib, plan, q, k, v, o, lse, do, dq, dk, dv, ws, backend, torch, bias=None, dbias=None, slopes=None,
            cuq=None, cuk=None):
    a = BwdArgs(ctypes.sizeof(BwdArgs), ptr(q), ptr(k), ptr(v), ptr(o), ptr(lse), ptr(do), ptr(dq), ptr(dk), ptr(dv),
                ptr(bias), ptr(dbias), ptr(slopes), ptr(cuq), ptr(cuk))
    lib.check(lib.bwd(plan.h, ctypes.byref(a), ptr(ws), 0 if ws is None else ws.numel(), stream_ptr(torch, backend)))


# ----------------------------------------------------------------------------- helpers
def flops(b, h, sq, sk, d, causal, direction):
    f = 4.0 * b * h * sq * sk * d
    if causal:
        f /= 2
    return f * (2.5 if direction == "bwd" else 1.0)


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


# ----------------------------------------------------------------------------- peers
SDPA = ["flash", "cudnn", "efficient", "math"]


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


# ----------------------------------------------------------------------------- library runs
class LibCase:
    """Plan + tensors + workspace for one dense BSHD problem on the GPU."""

    def __init__(self, lib, torch, algo, q, k, v, do, causal, dtype, need_bwd, opts=None):
        b, sq, h, d = q.shape
        sk, hkv = k.shape[1], k.shape[2]
        self.lib, self.torch, self.need_bwd = lib, torch, need_bwd
        self.plan = make_plan(lib, BACKEND_CUDA, b, sq, sk, h, hkv, d, v.shape[3], dtype, algo, causal, opts)
        self.q, self.k, self.v, self.do = q, k, v, do
        self.o = torch.empty(b, sq, h, v.shape[3], dtype=q.dtype, device=q.device)
        self.lse = torch.empty(b, h, sq, dtype=torch.float32, device=q.device)
        self.ws_fwd = self.plan.ws(PASS_FWD)
        self.ws_bwd = self.plan.ws(PASS_BWD) if need_bwd else 0
        nbytes = max(self.ws_fwd, self.ws_bwd)
        self.ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=q.device)
        if need_bwd:
            self.dq, self.dk, self.dv = (torch.empty_like(x) for x in (q, k, v))

    def fwd(self):
        lib_fwd(self.lib, self.plan, self.q, self.k, self.v, self.o, self.lse, self.ws, BACKEND_CUDA, self.torch)

    def bwd(self):
        lib_bwd(self.lib, self.plan, self.q, self.k, self.v, self.o, self.lse, self.do, self.dq, self.dk, self.dv,
                self.ws, BACKEND_CUDA, self.torch)


def bench_lib(lib, torch, algo, q, k, v, do, causal, dtype, directions, opts=None):
    c = LibCase(lib, torch, algo, q, k, v, do, causal, dtype, "bwd" in directions, opts)
    res = {"ws_fwd": c.ws_fwd, "ws_bwd": c.ws_bwd, "errors": {}}
    c.fwd()  # surface a library error before timing
    if "fwd" in directions:
        res["fwd"] = time_cuda(torch, c.fwd)
    if "bwd" in directions:
        try:  # the forward's timing stands even if the backward is refused
            c.bwd()
            res["bwd"] = time_cuda(torch, c.bwd)
        except LibError as e:
            res["errors"]["bwd"] = "library " + short(e)
    return res


def std_fits(torch, b, h, sq, sk, bwd):
    """Whether the standard algorithm's O(N^2) workspace fits in free device memory."""
    per = b * h * sq * ((sk + 7) // 8 * 8) * 4
    need = per * (2 if bwd else 1)
    free, _ = torch.cuda.mem_get_info()
    return need < 0.8 * free, need


# ----------------------------------------------------------------------------- sweep
def run_sweep(args, lib, torch, rows):
    dev = torch.device("cuda")
    directions = ["fwd"] if args.no_bwd else ["fwd", "bwd"]
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}
    for dtype in args.dtypes:
        for d in args.hdims:
            for causal in (False, True):
                for sq in args.seqlens:
                    b, h = max(1, args.tokens // sq), max(1, 2048 // d)
                    base = dict(dtype=dtype, hdim=d, causal=int(causal), seqlen=sq, batch=b, heads=h)
                    g = torch.Generator(device=dev).manual_seed(sq * 1000 + d)
                    q, k, v, do = (torch.randn(b, sq, h, d, device=dev, dtype=tdt[dtype], generator=g)
                                   for _ in range(4))
                    impls = [("lib-flash", ALGO_FLASH), ("lib-standard", ALGO_STANDARD)] + [(n, None) for n in SDPA]
                    for impl, algo in impls:
                        if impl not in args.impls:
                            continue
                        dirs = list(directions)
                        res, err = {}, ""
                        try:
                            if impl == "lib-standard":
                                # The O(N^2) workspace: drop what does not fit (bwd needs twice fwd's).
                                fits_bwd, need_bwd = std_fits(torch, b, h, sq, sq, True)
                                fits_fwd, need_fwd = std_fits(torch, b, h, sq, sq, False)
                                if "bwd" in dirs and not fits_bwd:
                                    dirs = [x for x in dirs if x != "bwd"]
                                    err = f"bwd skipped: workspace {need_bwd / 2**30:.1f} GiB does not fit"
                                if "fwd" in dirs and not fits_fwd:
                                    raise MemoryError(f"skipped: workspace {need_fwd / 2**30:.1f} GiB does not fit")
                            if algo is not None:
                                res = bench_lib(lib, torch, algo, q, k, v, do, causal, dtype, dirs)
                            else:
                                if impl == "math" and b * h * sq * sq * 12 > 0.8 * torch.cuda.mem_get_info()[0]:
                                    raise MemoryError("skipped: the math backend's N^2 tensors do not fit")
                                res = bench_torch(torch, impl, q, k, v, do, causal, dirs)
                        except LibError as e:
                            err = "library " + short(e)
                        except MemoryError as e:
                            err = short(e)
                        except Exception as e:  # noqa: BLE001 (torch raises many kinds)
                            err = f"{type(e).__name__}: {short(e)}"
                            if "out of memory" in str(e).lower():
                                err = "OOM"
                        torch.cuda.empty_cache()
                        for direction in directions:
                            ms = res.get(direction)
                            tf = flops(b, h, sq, sq, d, causal, direction) / (ms * 1e-3) / 1e12 if ms else None
                            derr = res.get("errors", {}).get(direction, err)
                            rows.append(dict(base, impl=impl, direction=direction,
                                             ms=round(ms, 4) if ms else None, tflops=round(tf, 1) if tf else None,
                                             error=derr if not ms else ""))
                        msg = " ".join(f"{k_}={res[k_]:.3f}ms" for k_ in ("fwd", "bwd") if k_ in res)
                        err = " ".join([err] + list(res.get("errors", {}).values())).strip()
                        print(f"  {dtype} d={d} causal={int(causal)} sq={sq} {impl:13s} {msg} {err}", flush=True)
                    del q, k, v, do
                    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- memory
def run_memory(args, lib, torch):
    """Peak device memory of one fwd(+bwd) at a long sequence length: tensors + workspace."""
    dev = torch.device("cuda")
    d, sq = args.mem_hdim, args.mem_seqlen
    b, h = max(1, args.tokens // sq), max(1, 2048 // d)
    dt = torch.bfloat16
    out = dict(dtype="bf16", hdim=d, seqlen=sq, batch=b, heads=h, results={})
    for impl in ["lib-flash", "lib-standard", "flash", "cudnn", "math"]:
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        r = {}
        try:
            q, k, v, do = (torch.randn(b, sq, h, d, device=dev, dtype=dt) for _ in range(4))
            if impl.startswith("lib-"):
                algo = ALGO_FLASH if impl == "lib-flash" else ALGO_STANDARD
                if algo == ALGO_STANDARD and not std_fits(torch, b, h, sq, sq, not args.no_bwd)[0]:
                    raise MemoryError("workspace does not fit")
                c = LibCase(lib, torch, algo, q, k, v, do, False, "bf16", not args.no_bwd)
                c.fwd()
                if not args.no_bwd:
                    try:
                        c.bwd()
                    except LibError as e:
                        r["note"] = "forward only: bwd " + short(e, 80)
                r.update(ws_fwd=c.ws_fwd, ws_bwd=c.ws_bwd)
                torch.cuda.synchronize()
                del c
            else:
                import torch.nn.functional as F
                from torch.nn.attention import sdpa_kernel
                with sdpa_kernel([sdpa_backend(torch, impl)]):
                    qg, kg, vg = (x.transpose(1, 2).detach().requires_grad_(not args.no_bwd) for x in (q, k, v))
                    o = F.scaled_dot_product_attention(qg, kg, vg)
                    if not args.no_bwd:
                        torch.autograd.grad(o, (qg, kg, vg), do.transpose(1, 2))
                    torch.cuda.synchronize()
                    del o, qg, kg, vg
            r["peak_bytes"] = torch.cuda.max_memory_allocated() - base
        except LibError as e:
            r["error"] = "library " + short(e)
        except MemoryError as e:
            r["error"] = "skipped: " + short(e)
        except Exception as e:  # noqa: BLE001
            r["error"] = "OOM" if "out of memory" in str(e).lower() else f"{type(e).__name__}: {short(e)}"
        q = k = v = do = None
        out["results"][impl] = r
        print(f"  memory {impl:13s} " + (f"{r['peak_bytes'] / 2**20:.0f} MiB" if "peak_bytes" in r else r["error"]),
              flush=True)
    torch.cuda.empty_cache()
    return out


# ----------------------------------------------------------------------------- block sparse
def run_sparse(args, lib, torch):
    dev = torch.device("cuda")
    sq, d, blk = args.sparse_seqlen, 128, 128
    b, h = max(1, args.tokens // sq), 2048 // d
    nb = (sq + blk - 1) // blk
    rng = random.Random(7)
    q, k, v, do = (torch.randn(b, sq, h, d, device=dev, dtype=torch.bfloat16) for _ in range(4))
    out = dict(dtype="bf16", hdim=d, seqlen=sq, batch=b, heads=h, block=blk, results=[])
    for dens in (1.0, 0.5, 0.25, 0.125):
        lay = []
        for _ in range(h):
            for _ in range(nb):
                keep = set(rng.sample(range(nb), max(1, round(dens * nb))))
                lay += [1 if j in keep else 0 for j in range(nb)]
        actual = sum(lay) / len(lay)
        r = dict(density=dens, actual_density=round(actual, 4))
        try:
            res = bench_lib(lib, torch, ALGO_FLASH, q, k, v, do, False, "bf16",
                            ["fwd"] if args.no_bwd else ["fwd", "bwd"],
                            opts={"layout": (lay, h, nb, nb, blk, blk)})
            if res["errors"]:
                r["error"] = "; ".join(f"{k_}: {v_}" for k_, v_ in res["errors"].items())
            for direction in ("fwd", "bwd"):
                if direction in res:
                    r[direction + "_ms"] = round(res[direction], 4)
                    r[direction + "_tflops_effective"] = round(
                        flops(b, h, sq, sq, d, False, direction) * actual / (res[direction] * 1e-3) / 1e12, 1)
        except LibError as e:
            r["error"] = "library " + short(e)
        out["results"].append(r)
        print(f"  sparse density={dens:<6} " + " ".join(f"{k_}={v_}" for k_, v_ in r.items() if k_ != "density"),
              flush=True)
    base = out["results"][0].get("fwd_ms")
    for r in out["results"]:
        if base and r.get("fwd_ms"):
            r["fwd_speedup_vs_dense"] = round(base / r["fwd_ms"], 2)
    return out


# ----------------------------------------------------------------------------- verification
def verify(args, lib, torch):
    """Library CUDA results vs an fp64 reference (dense) and vs the CPU backend (options)."""
    dev = torch.device("cuda")
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    results = []

    def ref_fwd_bwd(q, k, v, do, causal, scale):
        # fp64 standard attention on [b, s, h, d] (GQA by repeating kv heads).
        qd, kd, vd, dod = (x.double().transpose(1, 2).detach() for x in (q, k, v, do))
        g = qd.shape[1] // kd.shape[1]
        kd, vd = kd.repeat_interleave(g, 1).requires_grad_(True), vd.repeat_interleave(g, 1).requires_grad_(True)
        qd.requires_grad_(True)
        s = scale * qd @ kd.transpose(-1, -2)
        if causal:
            sq, sk = s.shape[-2:]
            m = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril()
            s = s.masked_fill(~m, float("-inf"))
        lse = torch.logsumexp(s, -1)
        o = torch.softmax(s, -1) @ vd
        dq, dk, dv = torch.autograd.grad(o, (qd, kd, vd), dod)
        b, hq = dk.shape[0], dk.shape[1]
        dk = dk.view(b, hq // g, g, *dk.shape[2:]).sum(2)
        dv = dv.view(b, hq // g, g, *dv.shape[2:]).sum(2)
        return [x.transpose(1, 2) for x in (o, dq, dk, dv)] + [lse]

    def lowp_error(q, k, v, do, causal, scale, ref):
        # Error of a same-precision standard attention (PyTorch math on the input dtype).
        g = q.shape[2] // k.shape[2]
        qt = q.transpose(1, 2).detach().requires_grad_(True)
        kt = k.transpose(1, 2).repeat_interleave(g, 1).detach().requires_grad_(True)
        vt = v.transpose(1, 2).repeat_interleave(g, 1).detach().requires_grad_(True)
        s = (qt @ kt.transpose(-1, -2)) * scale
        if causal:
            m = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
            s = s.masked_fill(~m, float("-inf"))
        o = torch.softmax(s.float(), -1).to(q.dtype) @ vt
        dq, dk, dv = torch.autograd.grad(o, (qt, kt, vt), do.transpose(1, 2))
        b, hq = dk.shape[0], dk.shape[1]
        dk = dk.view(b, hq // g, g, *dk.shape[2:]).sum(2)
        dv = dv.view(b, hq // g, g, *dv.shape[2:]).sum(2)
        outs = [x.transpose(1, 2) for x in (o, dq, dk, dv)]
        return [(a.double() - r).abs().max().item() for a, r in zip(outs, ref[:4])]

    dense = [
        # b, sq, sk, hq, hkv, d, dtype, causal
        (2, 256, 256, 4, 4, 64, "bf16", False),
        (2, 257, 257, 4, 4, 128, "bf16", True),
        (1, 200, 333, 8, 2, 128, "fp16", False),
        (2, 128, 128, 4, 1, 256, "bf16", True),
        (1, 1, 77, 2, 2, 64, "fp16", False),
        (2, 190, 190, 4, 2, 64, "fp32", True),
        (1, 48, 12000, 2, 1, 128, "fp16", False),  # standard path: partly cached backward rows
        (1, 64, 16500, 2, 2, 64, "bf16", False),  # long rows: the standard path's uncached softmax kernels
    ]
    for (b, sq, sk, hq, hkv, d, dtype, causal) in dense:
        g = torch.Generator(device=dev).manual_seed(b * 7 + sq)
        q = torch.randn(b, sq, hq, d, device=dev, dtype=tdt[dtype], generator=g)
        k = torch.randn(b, sk, hkv, d, device=dev, dtype=tdt[dtype], generator=g)
        v = torch.randn(b, sk, hkv, d, device=dev, dtype=tdt[dtype], generator=g)
        do = torch.randn(b, sq, hq, d, device=dev, dtype=tdt[dtype], generator=g)
        scale = 1.0 / math.sqrt(d)
        ref = ref_fwd_bwd(q, k, v, do, causal, scale)
        base_err = lowp_error(q, k, v, do, causal, scale, ref) if dtype != "fp32" else [1e-5] * 4
        for algo, aname in ((ALGO_FLASH, "flash"), (ALGO_STANDARD, "standard")):
            name = f"dense {aname} b={b} sq={sq} sk={sk} hq={hq} hkv={hkv} d={d} {dtype} causal={int(causal)}"
            try:
                c = LibCase(lib, torch, algo, q, k, v, do, causal, dtype, True)
                c.o.fill_(float("nan"))
                c.lse.fill_(float("nan"))
                c.fwd()
                torch.cuda.synchronize()
            except LibError as e:
                results.append((name + " fwd", None, "library " + short(e)))
                continue
            # Pass: at most 2x the error of a same-precision standard attention (+ a floor).
            e_o = (c.o.double() - ref[0]).abs().max().item()
            lse_err = (c.lse.double() - ref[4]).abs().max().item()
            ok = math.isfinite(e_o) and e_o <= 2 * base_err[0] + 1e-3 and lse_err < 1e-2
            results.append((name + " fwd", ok, f"err o={e_o:.2e} (lowp {base_err[0]:.2e}) lse={lse_err:.1e}"))
            try:
                for t in (c.dq, c.dk, c.dv):
                    t.fill_(float("nan"))
                c.bwd()
                torch.cuda.synchronize()
            except LibError as e:
                results.append((name + " bwd", None, "library " + short(e)))
                continue
            errs = [(a.double() - r).abs().max().item() for a, r in zip((c.dq, c.dk, c.dv), ref[1:4])]
            ok = all(math.isfinite(e) and e <= 2 * be + 1e-3 for e, be in zip(errs, base_err[1:]))
            results.append((name + " bwd", ok, "err dq/dk/dv=" + "/".join(f"{e:.2e}" for e in errs) + " (lowp " +
                            "/".join(f"{e:.2e}" for e in base_err[1:]) + ")"))

    # The CUDA backend's memory-space checks: a host (unregistered) pointer is refused with
    # WRONG_MEMORY_SPACE naming the argument, and nothing is written.
    for algo, aname in ((ALGO_FLASH, "flash"), (ALGO_STANDARD, "standard")):
        label = f"api {aname}: host pointer for args.k is refused"
        q = torch.randn(1, 64, 2, 64, device=dev, dtype=torch.float16)
        c = LibCase(lib, torch, algo, q, q.clone(), q.clone(), q.clone(), False, "fp16", False)
        c.k = torch.randn(1, 64, 2, 64, dtype=torch.float16)  # host memory
        c.o.fill_(7.0)
        try:
            c.fwd()
            results.append((label, False, "accepted a host pointer"))
        except LibError as e:
            torch.cuda.synchronize()
            untouched = bool((c.o == 7.0).all())
            ok = e.status == 403 and "args.k" in str(e) and "host memory" in str(e) and untouched
            results.append((label, ok, short(e, 120) + ("" if untouched else " (output was written!)")))

    # Options: CUDA (both algorithms) against the CPU backend on the same inputs.
    b, s, hq, hkv, d = 2, 160, 4, 2, 64
    opt_cases = [
        ("softcap", {"softcap": 5.0}, None),
        ("alibi", {"bias": (BIAS_ALIBI, None)}, "slopes"),
        ("alibi-sym+window", {"bias": (BIAS_ALIBI_SYM, None), "window": (40, 16)}, "slopes"),
        ("bias-full", {}, "bias_full"),
        ("bias-bcast-b,h", {}, "bias_bcast"),
        ("dropout", {"dropout": 0.2}, None),
        ("causal-bottom-right", {"window": (-1, 0), "align": ALIGN_BOTTOM_RIGHT}, None),
        ("block-sparse", {"layout": None}, None),
        ("varlen", {"varlen": None}, None),
    ]
    for name, opts, extra in opt_cases:
        for algo, aname in ((ALGO_FLASH, "flash"), (ALGO_STANDARD, "standard")):
            label = f"option {name} ({aname}, bf16, vs CPU backend)"
            results.extend((label + suffix, ok, detail) for suffix, ok, detail in
                           compare_with_cpu(lib, torch, algo, b, s, hq, hkv, d, dict(opts), extra))
    return results


def compare_with_cpu(lib, torch, algo, b, s, hq, hkv, d, opts, extra):
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(11)
    varlen = "varlen" in opts
    sq, sk = (s, s) if varlen else (s, s + 24)
    if varlen:
        lens_q, lens_k = [37, 0, s], [50, 3, s - 10]
        cu_q = [0]
        cu_k = [0]
        for a_, c_ in zip(lens_q, lens_k):
            cu_q.append(cu_q[-1] + a_)
            cu_k.append(cu_k[-1] + c_)
        b = len(lens_q)
        tq, tk = cu_q[-1], cu_k[-1]
        opts["varlen"] = (tq, tk)
        shp_q, shp_k = (tq, hq, d), (tk, hkv, d)
    else:
        shp_q, shp_k = (b, sq, hq, d), (b, sk, hkv, d)
    if "layout" in opts:
        bq, bk = 32, 48
        nr, nc = (sq + bq - 1) // bq, (sk + bk - 1) // bk
        rng = random.Random(3)
        lay = [1 if rng.random() < 0.5 else 0 for _ in range(hq * nr * nc)]
        opts["layout"] = (lay, hq, nr, nc, bq, bk)
    q = torch.randn(*shp_q, generator=g).bfloat16()
    k = torch.randn(*shp_k, generator=g).bfloat16()
    v = torch.randn(*shp_k, generator=g).bfloat16()
    do = torch.randn(*shp_q, generator=g).bfloat16()
    slopes = torch.tensor([2.0 ** (-(i + 1)) for i in range(hq)], dtype=torch.float32) if extra == "slopes" else None
    bias = None
    if extra == "bias_full":
        bias = torch.randn(b, hq, sq, sk, generator=g).bfloat16()
        opts["bias"] = (BIAS_TENSOR, [hq * sq * sk, sq * sk, sk, 1])
    elif extra == "bias_bcast":
        bias = torch.randn(sq, sk, generator=g).bfloat16()
        opts["bias"] = (BIAS_TENSOR, [0, 0, sk, 1])
    want_dbias = bias is not None
    outs, errors = {}, {}
    for backend in (BACKEND_CPU, BACKEND_CUDA):
        dv_ = dev if backend == BACKEND_CUDA else torch.device("cpu")
        T = [None if x is None else x.to(dv_).contiguous() for x in (q, k, v, do, bias, slopes)]
        qq, kk, vv, dd, bb, ss = T
        cuq = torch.tensor(cu_q, dtype=torch.int32, device=dv_) if varlen else None
        cuk = torch.tensor(cu_k, dtype=torch.int32, device=dv_) if varlen else None
        res = outs[backend] = {}
        try:
            plan = make_plan(lib, backend, b, sq, sk, hq, hkv, d, d, "bf16",
                             algo if backend == BACKEND_CUDA else ALGO_FLASH, False, opts)
            o = torch.full(shp_q, float("nan"), dtype=torch.bfloat16, device=dv_)
            lse = torch.full((hq, shp_q[0]) if varlen else (b, hq, sq), float("nan"), dtype=torch.float32,
                             device=dv_)
            nbytes = max(plan.ws(PASS_FWD), plan.ws(PASS_BWD))
            ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=dv_)
            lib_fwd(lib, plan, qq, kk, vv, o, lse, ws, backend, torch, bb, ss, cuq, cuk)
            res.update(o=o.float().cpu(), lse=lse.float().cpu())
            dq, dk, dvv = (torch.full_like(x, float("nan")) for x in (qq, kk, vv))
            dbias = torch.full_like(bb, float("nan")) if want_dbias else None
            lib_bwd(lib, plan, qq, kk, vv, o, lse, dd, dq, dk, dvv, ws, backend, torch, bb, dbias, ss, cuq, cuk)
            if backend == BACKEND_CUDA:
                torch.cuda.synchronize()
            res.update(dq=dq.float().cpu(), dk=dk.float().cpu(), dv=dvv.float().cpu())
            if want_dbias:
                res["dbias"] = dbias.float().cpu()
        except LibError as e:
            errors[backend] = "library " + short(e)

    def rel_err(a, c):
        fin = torch.isfinite(c)
        # Infinities (-inf LSE of fully masked rows) must match exactly; NaN never.
        if bool((~fin & (a != c)).any()) or bool(torch.isnan(a).any()):
            return float("inf")
        if not fin.any():
            return 0.0
        scale = max(c[fin].abs().max().item(), 1e-6)
        return (a[fin] - c[fin]).abs().max().item() / scale

    out = []
    for suffix, names in ((" fwd", ["o", "lse"]), (" bwd", ["dq", "dk", "dv", "dbias"])):
        names = [n_ for n_ in names if n_ in outs[BACKEND_CPU]]
        if not names or any(n_ not in outs[BACKEND_CUDA] for n_ in names):
            why = errors.get(BACKEND_CUDA) or errors.get(BACKEND_CPU) or "not run"
            out.append((suffix, None, why))
            continue
        errs = {n_: rel_err(outs[BACKEND_CUDA][n_], outs[BACKEND_CPU][n_]) for n_ in names}
        # bf16 outputs of two fp32-accumulating implementations: ~1e-2 relative to the max.
        ok = all(e < 2e-2 for e in errs.values())
        out.append((suffix, ok, "rel err " + " ".join(f"{n_}={e:.1e}" for n_, e in errs.items())))
    return out


# ----------------------------------------------------------------------------- output
def write_outputs(args, rows, memory, sparse, verify_res, meta):
    os.makedirs(args.out, exist_ok=True)
    keys = ["dtype", "hdim", "causal", "seqlen", "batch", "heads", "impl", "direction", "ms", "tflops", "error"]
    with open(os.path.join(args.out, "bench.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in keys})
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(dict(meta=meta, sweep=rows, memory=memory, sparse=sparse,
                       verify=[dict(name=n, ok=ok, detail=d) for n, ok, d in (verify_res or [])]), f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not importable; skipping bench.png")
        return
    combos = sorted({(r["dtype"], r["hdim"], r["causal"]) for r in rows})
    dirs = sorted({r["direction"] for r in rows}, reverse=True)
    if not combos:
        return
    fig, axes = plt.subplots(len(dirs), len(combos), figsize=(3.2 * len(combos), 3.0 * len(dirs)), squeeze=False)
    impls = []
    for r in rows:
        if r["impl"] not in impls:
            impls.append(r["impl"])
    for ci, (dt, hd, ca) in enumerate(combos):
        for di, direction in enumerate(dirs):
            ax = axes[di][ci]
            for impl in impls:
                pts = [(r["seqlen"], r["tflops"]) for r in rows if r["impl"] == impl and r["dtype"] == dt and
                       r["hdim"] == hd and r["causal"] == ca and r["direction"] == direction and r["tflops"]]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl,
                            color=f"C{impls.index(impl) % 10}")  # one colour per impl in every panel
            ax.set_xscale("log", base=2)
            ax.set_title(f"{direction} {dt} d={hd}{' causal' if ca else ''}", fontsize=8)
            ax.set_xlabel("seqlen", fontsize=7)
            ax.set_ylabel("TFLOP/s", fontsize=7)
            ax.tick_params(labelsize=6)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "bench.png"), dpi=110)
    print(f"wrote {os.path.join(args.out, 'bench.png')}")


def print_table(rows, memory, sparse, verify_res):
    print()
    print("==== bench_peers results")
    if verify_res:
        npass = sum(1 for _, ok, _ in verify_res if ok)
        nfail = sum(1 for _, ok, _ in verify_res if ok is False)
        nerr = sum(1 for _, ok, _ in verify_res if ok is None)
        print(f"== verification: {npass} pass, {nfail} FAIL, {nerr} library error")
        for n, ok, d in verify_res:
            print(f"  {'PASS' if ok else ('FAIL' if ok is False else 'ERR ')} {n}: {d}")
    if memory:
        print(f"== peak memory, fwd+bwd, bf16 d={memory['hdim']} seqlen={memory['seqlen']} b={memory['batch']} "
              f"h={memory['heads']} (tensors + workspace)")
        for impl, r in memory["results"].items():
            extra = ""
            if "ws_fwd" in r:
                extra = f"  (workspace fwd {r['ws_fwd'] / 2**20:.1f} MiB, bwd {r['ws_bwd'] / 2**20:.1f} MiB)"
            extra += f"  [{r['note']}]" if "note" in r else ""
            print(f"  {impl:13s} " + (f"{r['peak_bytes'] / 2**20:9.0f} MiB" if "peak_bytes" in r else r["error"]) + extra)
    if sparse:
        print(f"== block-sparse lib-flash, bf16 d=128 seqlen={sparse['seqlen']} block {sparse['block']}x{sparse['block']}")
        for r in sparse["results"]:
            print("  " + " ".join(f"{k}={v}" for k, v in r.items()))
    if not rows:
        return
    errs = [r for r in rows if r["error"]]
    if errs:
        print("== errors (first per impl/message)")
        seen = set()
        for r in errs:
            key = (r["impl"], r["error"][:60])
            if key in seen:
                continue
            seen.add(key)
            print(f"  {r['impl']} {r['dtype']} d={r['hdim']} c={r['causal']} sq={r['seqlen']} {r['direction']}: "
                  f"{r['error']}")
    impls = []
    for r in rows:
        if r["impl"] not in impls:
            impls.append(r["impl"])
    by = {(r["dtype"], r["hdim"], r["causal"], r["seqlen"], r["direction"], r["impl"]): r for r in rows}
    print("== TFLOP/s (fwd 4*b*h*sq*sk*d, /2 causal; bwd 2.5x); ratio = lib-flash / peer")
    hdr = f"{'dtype':5} {'d':>3} {'c':>1} {'seqlen':>6} {'dir':3} " + " ".join(f"{i[:12]:>12}" for i in impls) + \
          f" {'/flash':>7} {'/cudnn':>7}"
    print(hdr)
    keys = sorted({k[:5] for k in by}, key=lambda k: (k[0], k[1], k[2], k[4] != "fwd", k[3]))
    for k in keys:
        cells = []
        for i in impls:
            r = by.get(k + (i,))
            cells.append(f"{r['tflops']:12.1f}" if r and r["tflops"] else f"{'err' if r and r['error'] else '-':>12}")

        def ratio(peer):
            a, p = by.get(k + ("lib-flash",)), by.get(k + (peer,))
            if a and p and a["tflops"] and p["tflops"]:
                return f"{a['tflops'] / p['tflops']:7.2f}"
            return f"{'-':>7}"
        print(f"{k[0]:5} {k[1]:3d} {k[2]:1d} {k[3]:6d} {k[4]:3} " + " ".join(cells) + f" {ratio('flash')} {ratio('cudnn')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="path of libflashattn.so.0 (default: build*/ of the repo, then the loader path)")
    ap.add_argument("--out", default="bench-out", help="output folder for bench.csv/json/png")
    ap.add_argument("--quick", action="store_true",
                    help="defaults become bf16, d=64/128, seqlen 1k/4k/16k (explicit flags still win)")
    ap.add_argument("--dtypes", help="comma list (default bf16,fp16)")
    ap.add_argument("--hdims", help="comma list (default 64,128,256)")
    ap.add_argument("--seqlens", help="comma list (default 512,1024,2048,4096,8192,16384)")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per batch (b = tokens / seqlen)")
    ap.add_argument("--impls", default="lib-flash,lib-standard," + ",".join(SDPA))
    ap.add_argument("--no-bwd", action="store_true", help="forward only")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--no-sparse", action="store_true")
    ap.add_argument("--verify", action="store_true", help="check library results before timing")
    ap.add_argument("--mem-seqlen", type=int, default=16384)
    ap.add_argument("--mem-hdim", type=int, default=128)
    ap.add_argument("--sparse-seqlen", type=int, default=8192)
    args = ap.parse_args()
    defaults = (("bf16", "64,128", "1024,4096,16384") if args.quick else
                ("bf16,fp16", "64,128,256", "512,1024,2048,4096,8192,16384"))
    args.dtypes = args.dtypes or defaults[0]
    args.hdims = args.hdims or defaults[1]
    args.seqlens = args.seqlens or defaults[2]
    args.dtypes = [x for x in args.dtypes.split(",") if x]
    args.hdims = [int(x) for x in args.hdims.split(",") if x]
    args.seqlens = [int(x) for x in args.seqlens.split(",") if x]
    args.impls = [x for x in args.impls.split(",") if x]

    import torch
    lib = Lib(args.lib)
    if not torch.cuda.is_available() or lib.device_count() == 0:
        print(f"no CUDA device (torch: {torch.cuda.is_available()}, libflashattn: {lib.device_count()}); nothing to do")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    prop = torch.cuda.get_device_properties(0)
    meta = dict(device=prop.name, sms=prop.multi_processor_count, torch=torch.__version__,
                cudnn=torch.backends.cudnn.version(), lib=lib.path, time=time.strftime("%Y-%m-%d %H:%M:%S"))
    print(f"device {prop.name} SMs {prop.multi_processor_count} torch {torch.__version__} "
          f"cudnn {torch.backends.cudnn.version()} lib {lib.path}", flush=True)

    verify_res = verify(args, lib, torch) if args.verify else None
    rows = []
    if not args.no_sweep:
        run_sweep(args, lib, torch, rows)
    memory = None if args.no_memory else run_memory(args, lib, torch)
    sparse = None if args.no_sparse else run_sparse(args, lib, torch)
    write_outputs(args, rows, memory, sparse, verify_res, meta)
    print_table(rows, memory, sparse, verify_res)
    if verify_res and any(ok is False for _, ok, _ in verify_res):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
