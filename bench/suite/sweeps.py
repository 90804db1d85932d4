"""The measurements: throughput sweep (library vs SDPA), peak memory at a long sequence,
block-sparse runtime against layout density."""
import random

from .library import LibCase, bench_lib, lib_calls, std_fits
from .timing import SDPA, flops, hdim_label, sdpa_backend, short, time_cuda_rounds, torch_calls

# The library's implementations: name -> (algorithm, plan options). lib-flash-det is the FLASH
# algorithm in deterministic mode (flashattn_plan_set_deterministic), lib-flash-drop with
# dropout of p = 0.1, to measure their costs.
LIB_IMPLS = {"lib-flash": ("flash", None), "lib-flash-det": ("flash", {"deterministic": True}),
             "lib-flash-drop": ("flash", {"dropout_p": 0.1, "seed": 1234, "offset": 0}),
             "lib-standard": ("standard", None)}


# The implementations whose O(N^2) memory would crowd the others' out: each is timed alone,
# after the cell's other implementations.
ALONE = ("lib-standard", "math")


def run_sweep(args, fa, torch, on_row):
    """Every (dtype, head dim, causal, seqlen, impl, direction) of args; on_row(row) gets
    each cell's rows as soon as the cell is measured. A cell's O(N)-memory implementations
    are timed together, in rounds (timing.time_cuda_rounds), so each runs in the same power
    and clock state as its peers; lib-standard and math each alone after them."""
    dev = torch.device("cuda")
    directions = ["fwd"] if args.no_bwd else ["fwd", "bwd"]
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    impls = [n for n in list(LIB_IMPLS) + SDPA if n in args.impls]
    for dtype in args.dtypes:
        for d, dv in args.hdims:
            for causal in (False, True):
                for sq in args.seqlens:
                    b, h = max(1, args.tokens // sq), max(1, 2048 // d)
                    base = dict(dtype=dtype, hdim=hdim_label(d, dv), causal=int(causal), seqlen=sq, batch=b, heads=h)
                    g = torch.Generator(device=dev).manual_seed(sq * 1000 + d)
                    q, k, v, do = (torch.randn(b, sq, h, w, device=dev, dtype=tdt[dtype], generator=g)
                                   for w in (d, d, dv, dv))
                    res = time_group(fa, torch, [n for n in impls if n not in ALONE], q, k, v, do, causal, dtype,
                                     directions)
                    for impl in impls:
                        if impl in ALONE:
                            res.update(time_group(fa, torch, [impl], q, k, v, do, causal, dtype, directions))
                    for impl in impls:
                        r = res[impl]
                        for direction in directions:
                            ms = r.get(direction)
                            tf = flops(b, h, sq, sq, d, causal, direction, dv) / (ms * 1e-3) / 1e12 if ms else None
                            derr = r["errors"].get(direction, r["err"])
                            on_row(dict(base, impl=impl, direction=direction, ms=round(ms, 4) if ms else None,
                                        tflops=round(tf, 1) if tf else None, error=derr if not ms else ""))
                        msg = " ".join(f"{k_}={r[k_]:.3f}ms" for k_ in ("fwd", "bwd") if k_ in r)
                        err = " ".join([r["err"]] + list(r["errors"].values())).strip()
                        print(f"  {dtype} d={base['hdim']} causal={int(causal)} sq={sq} {impl:13s} {msg} {err}",
                              flush=True)
                    del q, k, v, do
                    torch.cuda.empty_cache()


def time_group(fa, torch, names, q, k, v, do, causal, dtype, directions):
    """Times implementations `names` on one problem, together in rounds: impl -> {direction:
    ms, "errors": {direction: message}, "err": message}. Each implementation's calls run once
    on their own first, so a failure is reported against the implementation that failed."""
    out, calls, keep = {}, {}, []
    for impl in names:
        r = out[impl] = {"errors": {}, "err": ""}
        try:
            got = impl_calls(fa, torch, impl, q, k, v, do, causal, dtype, directions, r, keep)
            for fn in got.values():
                fn()
            torch.cuda.synchronize()
            calls.update({(impl, direction): fn for direction, fn in got.items()})
        except fa.FlashAttnError as e:
            r["err"] = "library " + short(e)
        except MemoryError as e:
            r["err"] = short(e)
        except Exception as e:  # noqa: BLE001 (torch raises many kinds)
            r["err"] = "OOM" if "out of memory" in str(e).lower() else f"{type(e).__name__}: {short(e)}"
    try:
        for (impl, direction), ms in (time_cuda_rounds(torch, calls) if calls else {}).items():
            out[impl][direction] = ms
    except Exception as e:  # noqa: BLE001
        for impl, _ in calls:
            out[impl]["err"] = "OOM" if "out of memory" in str(e).lower() else f"{type(e).__name__}: {short(e)}"
    del calls, keep
    torch.cuda.empty_cache()
    return out


def impl_calls(fa, torch, impl, q, k, v, do, causal, dtype, directions, r, keep):
    """Implementation `impl`'s timed calls on one problem: direction -> function; what it
    cannot run goes to r["err"] or r["errors"], the buffers to hold while timing to keep."""
    b, sq, h, _ = q.shape
    dirs = list(directions)
    if impl == "lib-standard":
        # The O(N^2) workspace: drop what does not fit (bwd needs twice fwd's).
        fits_bwd, need_bwd = std_fits(torch, b, h, sq, sq, True)
        fits_fwd, need_fwd = std_fits(torch, b, h, sq, sq, False)
        if "bwd" in dirs and not fits_bwd:
            dirs.remove("bwd")
            r["err"] = f"bwd skipped: workspace {need_bwd / 2**30:.1f} GiB does not fit"
        if "fwd" in dirs and not fits_fwd:
            raise MemoryError(f"skipped: workspace {need_fwd / 2**30:.1f} GiB does not fit")
    if impl in LIB_IMPLS:
        algo, opts = LIB_IMPLS[impl]
        case, calls, errors = lib_calls(fa, torch, algo, q, k, v, do, causal, dtype, dirs, opts)
        keep.append(case)
        r["errors"].update(errors)
        return calls
    if impl == "math" and b * h * sq * sq * 12 > 0.8 * torch.cuda.mem_get_info()[0]:
        raise MemoryError("skipped: the math backend's N^2 tensors do not fit")
    return torch_calls(torch, impl, q, k, v, do, causal, dirs)


def run_memory(args, fa, torch):
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
                algo = LIB_IMPLS[impl][0]
                if algo == "standard" and not std_fits(torch, b, h, sq, sq, not args.no_bwd)[0]:
                    raise MemoryError("workspace does not fit")
                c = LibCase(fa, torch, algo, q, k, v, do, False, "bf16", not args.no_bwd)
                c.check_fwd()
                if not args.no_bwd:
                    try:
                        c.check_bwd()
                    except fa.FlashAttnError as e:
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
        except fa.FlashAttnError as e:
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


def run_sparse(args, fa, torch):
    """lib-flash with random block-sparse layouts of density 1, 1/2, 1/4, 1/8 (128x128 blocks)."""
    import numpy as np
    dev = torch.device("cuda")
    sq, d, blk = args.sparse_seqlen, 128, 128
    b, h = max(1, args.tokens // sq), 2048 // d
    nb = (sq + blk - 1) // blk
    rng = random.Random(7)
    q, k, v, do = (torch.randn(b, sq, h, d, device=dev, dtype=torch.bfloat16) for _ in range(4))
    out = dict(dtype="bf16", hdim=d, seqlen=sq, batch=b, heads=h, block=blk, results=[])
    for dens in (1.0, 0.5, 0.25, 0.125):
        lay = np.zeros((h, nb, nb), dtype=np.uint8)
        for hh in range(h):
            for i in range(nb):
                lay[hh, i, rng.sample(range(nb), max(1, round(dens * nb)))] = 1
        actual = float(lay.mean())
        r = dict(density=dens, actual_density=round(actual, 4))
        try:
            res = bench_lib(fa, torch, "flash", q, k, v, do, False, "bf16", ["fwd"] if args.no_bwd else ["fwd", "bwd"],
                            opts={"block_sparse": (lay, blk, blk)})
            if res["errors"]:
                r["error"] = "; ".join(f"{k_}: {v_}" for k_, v_ in res["errors"].items())
            for direction in ("fwd", "bwd"):
                if direction in res:
                    r[direction + "_ms"] = round(res[direction], 4)
                    r[direction + "_tflops_effective"] = round(
                        flops(b, h, sq, sq, d, False, direction) * actual / (res[direction] * 1e-3) / 1e12, 1)
        except fa.FlashAttnError as e:
            r["error"] = "library " + short(e)
        out["results"].append(r)
        print(f"  sparse density={dens:<6} " + " ".join(f"{k_}={v_}" for k_, v_ in r.items() if k_ != "density"),
              flush=True)
    base = out["results"][0].get("fwd_ms")
    for r in out["results"]:
        if base and r.get("fwd_ms"):
            r["fwd_speedup_vs_dense"] = round(base / r["fwd_ms"], 2)
    return out
