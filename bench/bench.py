#!/usr/bin/env python3
"""libflashattn on CUDA against its peers, in one process, on the same inputs: the one GPU
benchmark entry point.

Runs the library (FLASH and STANDARD algorithms, through the flashattn Python package of
bindings/python) and PyTorch SDPA's flash / cudnn / efficient / math backends on
identical tensors:
  * throughput sweep: bf16/fp16 (or fp32 with --dtypes: SDPA's flash and cudnn backends
    refuse fp32, its efficient backend takes it), head dims 64/128/256, causal or not,
    seqlen 512..16k at 16k tokens per batch (b = 16384/sq, h = 2048/d), forward and
    backward; TFLOP/s with
    the peers' convention (fwd 4*b*h*sq*sk*d, halved for causal; bwd 2.5x the forward),
    CUDA events around each call, warm-up, median of many runs, the implementations of
    a configuration timed together in rounds (the same power and clock state for each);
  * peak memory of flash vs standard attention (and PyTorch) at a long sequence length;
  * block-sparse runtime against layout density (seqlen 8k, blocks 128x128).
--verify checks the library's CUDA results first: against the fp64 reference
(reference/reference.py) for dense problems and against the library's own CPU backend for
every option. --profile instead breaks single calls into their kernels (suite/kernels.py).

Every sweep row is appended, as soon as it is measured, to --record (default
bench/results/sweep.csv; bench/results/README.md describes the columns). The run also
writes <out>/bench.csv, bench.json, bench.png (if matplotlib is importable) and prints a
compact table with ratios vs PyTorch flash and cuDNN last. A library error (e.g. a
configuration a kernel does not support) is reported in its row; the sweep goes on.
"""
import argparse
import os
import sys
import time

from suite import kernels, library, report, sweeps
from suite.timing import SDPA, parse_hdims

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="path of libflashattn.so.0 (default: $FLASHATTN_LIBRARY, else the newest "
                    "build*/ or build/*/ of the repository, else the loader path)")
    ap.add_argument("--out", default="bench-out", help="output folder for bench.csv/json/png")
    ap.add_argument("--record", default=os.path.join(HERE, "results", "sweep.csv"),
                    help="CSV the sweep rows are appended to (default bench/results/sweep.csv; '' for none)")
    ap.add_argument("--quick", action="store_true",
                    help="defaults become bf16, d=64/128, seqlen 1k/4k/16k (explicit flags still win)")
    ap.add_argument("--dtypes", help="comma list of bf16, fp16, fp32 (default bf16,fp16; --profile: bf16)")
    ap.add_argument("--hdims", help="comma list of head dims, d or d_qk/d_v such as 192/128 (default 64,128,256; "
                    "--profile: 128)")
    ap.add_argument("--seqlens", help="comma list (default 512,1024,2048,4096,8192,16384; --profile: 1024,16384)")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per batch (b = tokens / seqlen)")
    ap.add_argument("--impls", help="comma list of lib-flash, lib-flash-det (deterministic mode), lib-flash-drop "
                    "(dropout p = 0.1), lib-standard, " +
                    ", ".join(SDPA) +
                    " (default: all; --profile: lib-flash,flash,cudnn)")
    ap.add_argument("--no-bwd", action="store_true", help="forward only")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--no-sparse", action="store_true")
    ap.add_argument("--verify", action="store_true", help="check library results before timing")
    ap.add_argument("--mem-seqlen", type=int, default=16384)
    ap.add_argument("--mem-hdim", type=int, default=128)
    ap.add_argument("--sparse-seqlen", type=int, default=8192)
    prof = ap.add_argument_group("--profile: per-kernel GPU time of single calls (torch.profiler)")
    prof.add_argument("--profile", action="store_true", help="profile instead of the sweep, memory and sparse runs")
    prof.add_argument("--dir", default="bwd", choices=["fwd", "bwd"], help="the pass to profile (default bwd)")
    prof.add_argument("--causal", default="0", help="comma list of 0/1 (default 0)")
    prof.add_argument("--iters", type=int, default=20, help="calls per implementation (default 20)")
    prof.add_argument("--bare", action="store_true", help="only run the calls (for ncu or nsys)")
    a = ap.parse_args(argv)
    if a.profile:
        defaults = ("bf16", "128", "1024,16384", "lib-flash,flash,cudnn")
    elif a.quick:
        defaults = ("bf16", "64,128", "1024,4096,16384", None)
    else:
        defaults = ("bf16,fp16", "64,128,256", "512,1024,2048,4096,8192,16384", None)
    a.dtypes = [x for x in (a.dtypes or defaults[0]).split(",") if x]
    a.hdims = parse_hdims(a.hdims or defaults[1])
    a.seqlens = [int(x) for x in (a.seqlens or defaults[2]).split(",") if x]
    a.impls = [x for x in (a.impls or defaults[3] or ",".join(["lib-flash", "lib-standard"] + SDPA)).split(",") if x]
    a.causal = [bool(int(x)) for x in a.causal.split(",") if x]
    return a


def main(argv=None):
    args = parse_args(argv)
    import torch
    fa = library.load(args.lib)
    if not torch.cuda.is_available() or fa.cuda_device_count() == 0:
        print(f"no CUDA device (torch: {torch.cuda.is_available()}, libflashattn: {fa.cuda_device_count()}); "
              "nothing to do")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.profile:
        kernels.run_profile(args, fa, torch)
        return 0
    prop = torch.cuda.get_device_properties(0)
    meta = dict(device=prop.name, sms=prop.multi_processor_count, torch=torch.__version__,
                cudnn=torch.backends.cudnn.version(), lib=fa.library_path(), commit=report.commit(),
                time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    print(f"device {prop.name} SMs {prop.multi_processor_count} torch {torch.__version__} "
          f"cudnn {torch.backends.cudnn.version()} lib {meta['lib']} commit {meta['commit']}", flush=True)

    verify_res = None
    if args.verify:
        from suite import verify  # imports the fp64 reference, which needs numpy
        verify_res = verify.verify(fa, torch)
    rows = []
    record = report.Record(args.record, meta)

    def on_row(row):
        rows.append(row)
        record.append(row)
    if not args.no_sweep:
        sweeps.run_sweep(args, fa, torch, on_row)
    memory = None if args.no_memory else sweeps.run_memory(args, fa, torch)
    sparse = None if args.no_sparse else sweeps.run_sparse(args, fa, torch)
    report.write_outputs(args.out, rows, memory, sparse, verify_res, meta)
    report.print_table(rows, memory, sparse, verify_res)
    if verify_res and any(ok is False for _, ok, _ in verify_res):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
