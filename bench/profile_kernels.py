#!/usr/bin/env python3
"""Per-kernel GPU time of one attention call: the library against PyTorch SDPA's backends.

bench_peers.py gives the time of a whole call; this script says where that time goes.
For each shape it runs the library's FLASH algorithm and SDPA's flash and cudnn
backends on the same tensors (same layout and conventions as bench_peers: BSHD, b =
tokens/seqlen, h = 2048/d, N(0,1) inputs) under torch.profiler, after warm-up, and
prints every kernel's average GPU microseconds per call, with each implementation's
sum of kernel time next to its CUDA-event wall time per call. Host gaps between
kernels show as the difference between the two.

usage: profile_kernels.py [--lib PATH] [--dir fwd|bwd] [--hdims 64,128]
                          [--seqlens 1024,16384] [--causal 0,1] [--iters 20] [--bare]

--bare runs each call --iters times with no profiler of its own, for an outside one:
  ncu --kernel-name regex:'bwd_main|flash_bwd_dq_dk_dv' --launch-count 2 --set full \
      python3 bench/profile_kernels.py --bare --iters 2 --hdims 128 --seqlens 4096
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_peers as bp  # noqa: E402  (the ctypes ABI and LibCase live there)


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib")
    ap.add_argument("--dir", default="bwd", choices=["fwd", "bwd"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--hdims", default="128")
    ap.add_argument("--seqlens", default="1024,16384")
    ap.add_argument("--causal", default="0")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--impls", default="lib-flash,flash,cudnn")
    ap.add_argument("--bare", action="store_true", help="only run the calls (under ncu or nsys)")
    args = ap.parse_args()

    import torch
    from torch.nn.attention import sdpa_kernel
    lib = bp.Lib(args.lib)
    dev = torch.device("cuda")
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  direction {args.dir}")
    for d in (int(x) for x in args.hdims.split(",")):
        for sq in (int(x) for x in args.seqlens.split(",")):
            for causal in (bool(int(x)) for x in args.causal.split(",")):
                b, h = max(1, args.tokens // sq), max(1, 2048 // d)
                g = torch.Generator(device=dev).manual_seed(sq * 1000 + d)
                q, k, v, do = (torch.randn(b, sq, h, d, device=dev, dtype=tdt, generator=g) for _ in range(4))
                fl = bp.flops(b, h, sq, sq, d, causal, args.dir)
                print(f"\n== {args.dtype} d={d} seqlen={sq} b={b} h={h} causal={int(causal)}")
                for impl in args.impls.split(","):
                    if impl == "lib-flash":
                        c = bp.LibCase(lib, torch, bp.ALGO_FLASH, q, k, v, do, causal, args.dtype, args.dir == "bwd")
                        c.fwd()
                        fn = c.fwd if args.dir == "fwd" else c.bwd
                    else:
                        ctx = sdpa_kernel([bp.sdpa_backend(torch, impl)])
                        ctx.__enter__()
                        fn = bp.sdpa_call(torch, q, k, v, do, causal, args.dir)
                    if args.bare:
                        for _ in range(args.iters):
                            fn()
                        torch.cuda.synchronize()
                        if impl != "lib-flash":
                            ctx.__exit__(None, None, None)
                        print(f"  {impl}: ran {args.iters} calls")
                        continue
                    try:
                        total, kernels, wall = profile(torch, fn, args.iters)
                    except Exception as e:  # noqa: BLE001
                        print(f"  {impl}: {type(e).__name__}: {bp.short(e)}")
                        continue
                    finally:
                        if impl != "lib-flash":
                            ctx.__exit__(None, None, None)
                    print(f"  {impl:10s} wall {wall:9.1f} us/call ({fl / wall / 1e6:6.1f} TFLOP/s)  "
                          f"kernels {total:9.1f} us")
                    for name, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
                        print(f"      {us:9.1f} us  {100 * us / total:5.1f}%  {short_name(name)}")
                del q, k, v, do
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
