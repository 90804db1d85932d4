"""--verify: the library's CUDA results before any timing. Dense problems against the
project's Python fp64 reference (reference/reference.py) within twice the error of a
same-precision standard attention; the CUDA backend's memory-space check; every option
on CUDA (both algorithms) against the library's CPU backend on the same inputs."""
import math
import os
import random
import sys

from .library import REPO, LibCase
from .timing import short

sys.path.insert(0, os.path.join(REPO, "reference"))
import reference  # noqa: E402  (the project's Python fp64 reference)

DENSE = [
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

OPTIONS = [
    # name, Plan options, extra inputs
    ("softcap", {"softcap": 5.0}, None),
    ("alibi", {"alibi": True}, "slopes"),
    ("alibi-sym+window", {"alibi": "symmetric", "window": (40, 16)}, "slopes"),
    ("bias-full", {}, "bias_full"),
    ("bias-bcast-b,h", {}, "bias_bcast"),
    ("dropout", {"dropout_p": 0.2, "seed": 1234, "offset": 77}, None),
    ("causal-bottom-right", {"window": (-1, 0), "align": "bottom_right"}, None),
    ("block-sparse", {"block_sparse": None}, None),
    ("varlen", {"varlen": None}, None),
]


def fp64_reference(torch, q, k, v, do, causal, scale):
    """[o, dq, dk, dv, lse] of reference.attention as float64 tensors on q's device."""
    arrs = [x.detach().float().cpu().double().numpy() for x in (q, k, v, do)]
    r = reference.attention(*arrs, causal=causal, scale=scale)
    return [torch.from_numpy(r[n]).to(q.device) for n in ("o", "dq", "dk", "dv", "lse")]


def lowp_error(torch, q, k, v, do, causal, scale, ref):
    """Error of a same-precision standard attention (PyTorch math on the input dtype)."""
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


def verify(fa, torch):
    """[(name, ok (None: library error), detail)] of every check."""
    dev = torch.device("cuda")
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    results = []
    for (b, sq, sk, hq, hkv, d, dtype, causal) in DENSE:
        g = torch.Generator(device=dev).manual_seed(b * 7 + sq)
        q = torch.randn(b, sq, hq, d, device=dev, dtype=tdt[dtype], generator=g)
        k = torch.randn(b, sk, hkv, d, device=dev, dtype=tdt[dtype], generator=g)
        v = torch.randn(b, sk, hkv, d, device=dev, dtype=tdt[dtype], generator=g)
        do = torch.randn(b, sq, hq, d, device=dev, dtype=tdt[dtype], generator=g)
        scale = 1.0 / math.sqrt(d)
        ref = fp64_reference(torch, q, k, v, do, causal, scale)
        base_err = lowp_error(torch, q, k, v, do, causal, scale, ref) if dtype != "fp32" else [1e-5] * 4
        for algo in ("flash", "standard"):
            name = f"dense {algo} b={b} sq={sq} sk={sk} hq={hq} hkv={hkv} d={d} {dtype} causal={int(causal)}"
            try:
                c = LibCase(fa, torch, algo, q, k, v, do, causal, dtype, True)
                c.o.fill_(float("nan"))
                c.lse.fill_(float("nan"))
                c.check_fwd()
                torch.cuda.synchronize()
            except fa.FlashAttnError as e:
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
                c.check_bwd()
                torch.cuda.synchronize()
            except fa.FlashAttnError as e:
                results.append((name + " bwd", None, "library " + short(e)))
                continue
            errs = [(a.double() - r).abs().max().item() for a, r in zip((c.dq, c.dk, c.dv), ref[1:4])]
            ok = all(math.isfinite(e) and e <= 2 * be + 1e-3 for e, be in zip(errs, base_err[1:]))
            results.append((name + " bwd", ok, "err dq/dk/dv=" + "/".join(f"{e:.2e}" for e in errs) + " (lowp " +
                            "/".join(f"{e:.2e}" for e in base_err[1:]) + ")"))

    # The CUDA backend's memory-space checks: a host (unregistered) pointer is refused with
    # WRONG_MEMORY_SPACE naming the argument, and nothing is written. The package would
    # refuse it in Python first, so this goes through the prepared C call.
    for algo in ("flash", "standard"):
        label = f"api {algo}: host pointer for args.k is refused"
        q = torch.randn(1, 64, 2, 64, device=dev, dtype=torch.float16)
        c = LibCase(fa, torch, algo, q, q.clone(), q.clone(), q.clone(), False, "fp16", False)
        c.k = torch.randn(1, 64, 2, 64, dtype=torch.float16)  # host memory
        c.prepare()
        c.o.fill_(7.0)
        try:
            c.fwd()
            results.append((label, False, "accepted a host pointer"))
        except fa.FlashAttnError as e:
            torch.cuda.synchronize()
            untouched = bool((c.o == 7.0).all())
            ok = e.status == fa.Status.WRONG_MEMORY_SPACE and "args.k" in str(e) and "host memory" in str(e) and \
                untouched
            results.append((label, ok, short(e, 120) + ("" if untouched else " (output was written!)")))

    b, s, hq, hkv, d = 2, 160, 4, 2, 64
    for name, opts, extra in OPTIONS:
        for algo in ("flash", "standard"):
            label = f"option {name} ({algo}, bf16, vs CPU backend)"
            results.extend((label + suffix, ok, detail) for suffix, ok, detail in
                           compare_with_cpu(fa, torch, algo, b, s, hq, hkv, d, dict(opts), extra))
    return results


def compare_with_cpu(fa, torch, algo, b, s, hq, hkv, d, opts, extra):
    """One option on CUDA (algorithm `algo`) and on the CPU backend (flash), bf16."""
    import numpy as np
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(11)
    varlen = "varlen" in opts
    sq, sk = (s, s) if varlen else (s, s + 24)
    cu_q = cu_k = None
    if varlen:
        lens_q, lens_k = [37, 0, s], [50, 3, s - 10]
        cu_q, cu_k = np.concatenate([[0], np.cumsum(lens_q)]), np.concatenate([[0], np.cumsum(lens_k)])
        b = len(lens_q)
        opts["varlen"] = (int(cu_q[-1]), int(cu_k[-1]))
        shp_q, shp_k = (opts["varlen"][0], hq, d), (opts["varlen"][1], hkv, d)
    else:
        shp_q, shp_k = (b, sq, hq, d), (b, sk, hkv, d)
    if "block_sparse" in opts:
        bq, bk = 32, 48
        nr, nc = (sq + bq - 1) // bq, (sk + bk - 1) // bk
        rng = random.Random(3)
        lay = np.array([1 if rng.random() < 0.5 else 0 for _ in range(hq * nr * nc)], dtype=np.uint8)
        opts["block_sparse"] = (lay.reshape(hq, nr, nc), bq, bk)
    q = torch.randn(*shp_q, generator=g).bfloat16()
    k = torch.randn(*shp_k, generator=g).bfloat16()
    v = torch.randn(*shp_k, generator=g).bfloat16()
    do = torch.randn(*shp_q, generator=g).bfloat16()
    slopes = torch.tensor([2.0 ** (-(i + 1)) for i in range(hq)], dtype=torch.float32) if extra == "slopes" else None
    bias = None
    if extra == "bias_full":
        bias = torch.randn(b, hq, sq, sk, generator=g).bfloat16()
        opts.update(bias="tensor", bias_strides=(hq * sq * sk, sq * sk, sk, 1))
    elif extra == "bias_bcast":
        bias = torch.randn(1, 1, sq, sk, generator=g).bfloat16()
        opts.update(bias="tensor", bias_strides=(0, 0, sk, 1))
    outs, errors = {}, {}
    for backend in ("cpu", "cuda"):
        dv_ = dev if backend == "cuda" else torch.device("cpu")
        qq, kk, vv, dd, bb, ss = (None if x is None else x.to(dv_).contiguous() for x in (q, k, v, do, bias, slopes))
        cuq, cuk = ((torch.tensor(cu, dtype=torch.int32, device=dv_) for cu in (cu_q, cu_k)) if varlen
                    else (None, None))
        res = outs[backend] = {}
        try:
            plan = fa.Plan(b, sq, sk, hq, hkv, d, d, dtype="bf16", backend=backend,
                           algorithm=algo if backend == "cuda" else "flash", **opts)
            o = torch.full(shp_q, float("nan"), dtype=torch.bfloat16, device=dv_)
            lse = torch.full(plan.lse_shape(), float("nan"), dtype=torch.float32, device=dv_)
            plan.forward(qq, kk, vv, out=o, lse=lse, bias=bb, alibi_slopes=ss, cu_seqlens_q=cuq, cu_seqlens_k=cuk)
            res.update(o=o.float().cpu(), lse=lse.float().cpu())
            dq, dk, dvv = (torch.full_like(x, float("nan")) for x in (qq, kk, vv))
            dbias = torch.full_like(bb, float("nan")) if bias is not None else None
            plan.backward(qq, kk, vv, o, lse, dd, dq=dq, dk=dk, dv=dvv, bias=bb, dbias=dbias, alibi_slopes=ss,
                          cu_seqlens_q=cuq, cu_seqlens_k=cuk)
            if backend == "cuda":
                torch.cuda.synchronize()
            res.update(dq=dq.float().cpu(), dk=dk.float().cpu(), dv=dvv.float().cpu())
            if dbias is not None:
                res["dbias"] = dbias.float().cpu()
        except fa.FlashAttnError as e:
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
        names = [n_ for n_ in names if n_ in outs["cpu"]]
        if not names or any(n_ not in outs["cuda"] for n_ in names):
            why = errors.get("cuda") or errors.get("cpu") or "not run"
            out.append((suffix, None, why))
            continue
        errs = {n_: rel_err(outs["cuda"][n_], outs["cpu"][n_]) for n_ in names}
        # bf16 outputs of two fp32-accumulating implementations: ~1e-2 relative to the max.
        ok = all(e < 2e-2 for e in errs.values())
        out.append((suffix, ok, "rel err " + " ".join(f"{n_}={e:.1e}" for n_, e in errs.items())))
    return out
