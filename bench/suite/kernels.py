"""--profile: per-kernel GPU time of one attention call, the library against PyTorch SDPA.

The sweep gives the time of a whole call; this says where that time goes. For each shape
it runs the library's FLASH algorithm and SDPA's backends on the same tensors (the
sweep's layout and conventions: BSHD, b = tokens/seqlen, h = 2048/d, N(0,1) inputs) under
torch.profiler, after warm-up, and prints every kernel's average GPU microseconds per
call, with each implementation's sum of kernel time next to its CUDA-event wall time per
call. Host gaps between kernels show as the difference between the two.

--bare runs each call --iters times with no profiler of its own, for an outside one
(bench/ncu_compare.sh runs Nsight Compute this way).
"""
from .library import LibCase
from .sweeps import LIB_IMPLS
from .timing import flops, hdim_label, sdpa_backend, sdpa_call, short


def short_name(name, n=90):
    name = name.replace("void ", "")
    return name if len(name) <= n else name[:n - 3] + "..."


def profile(torch, fn, iters):
    """(sum of kernel us per call, {kernel: us per call}, event-timed us per call)."""
    from torch.profiler import ProfilerActivity, profile as tprofile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        fn()
    e1.record()
    torch.cuda.synchronize()
    wall_us = e0.elapsed_time(e1) * 1e3 / iters
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    kernels = {}
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None)
        if us is None:
            us = ev.cuda_time_total
        if us <= 0 or ev.key.startswith("ProfilerStep"):
            continue
        kernels[ev.key] = kernels.get(ev.key, 0.0) + us / iters
    return sum(kernels.values()), kernels, wall_us


def run_profile(args, fa, torch):
    from torch.nn.attention import sdpa_kernel
    dev = torch.device("cuda")
    dtype = args.dtypes[0]
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  direction {args.dir}")
    for d, dv in args.hdims:
        for sq in args.seqlens:
            for causal in args.causal:
                b, h = max(1, args.tokens // sq), max(1, 2048 // d)
                g = torch.Generator(device=dev).manual_seed(sq * 1000 + d)
                q, k, v, do = (torch.randn(b, sq, h, w, device=dev, dtype=tdt, generator=g) for w in (d, d, dv, dv))
                fl = flops(b, h, sq, sq, d, causal, args.dir, dv)
                print(f"\n== {dtype} d={hdim_label(d, dv)} seqlen={sq} b={b} h={h} causal={int(causal)}")
                for impl in args.impls:
                    ctx = None
                    if impl in LIB_IMPLS:
                        algo, opts = LIB_IMPLS[impl]
                        c = LibCase(fa, torch, algo, q, k, v, do, causal, dtype, args.dir == "bwd", opts)
                        c.check_fwd()  # O and LSE for the backward (ncu_compare.sh skips its launch)
                        fn = c.fwd if args.dir == "fwd" else c.bwd
                    else:
                        ctx = sdpa_kernel([sdpa_backend(torch, impl)])
                        ctx.__enter__()
                        fn = sdpa_call(torch, q, k, v, do, causal, args.dir)
                    try:
                        if args.bare:
                            for _ in range(args.iters):
                                fn()
                            torch.cuda.synchronize()
                            print(f"  {impl}: ran {args.iters} calls")
                            continue
                        total, kernels, wall = profile(torch, fn, args.iters)
                    except Exception as e:  # noqa: BLE001
                        print(f"  {impl}: {type(e).__name__}: {short(e)}")
                        continue
                    finally:
                        if ctx is not None:
                            ctx.__exit__(None, None, None)
                    print(f"  {impl:10s} wall {wall:9.1f} us/call ({fl / wall / 1e6:6.1f} TFLOP/s)  "
                          f"kernels {total:9.1f} us")
                    for name, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
                        print(f"      {us:9.1f} us  {100 * us / total:5.1f}%  {short_name(name)}")
                del q, k, v, do
                torch.cuda.empty_cache()
