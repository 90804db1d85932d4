#!/usr/bin/env python3
"""Appends the forward comparison of issue 17 to bench/results/h100.csv: one row per
(pass, dtype, head_dim, causal, seqlen) with this library's forward (the run forced to the
fa3 path), cuDNN (PyTorch SDPA, measured beside it in that run), the library's fa2 path
(a second run forced to fa2) and the cuBLAS bf16 8192^3 matmul rate, which this script
measures itself right after the two runs, on the same GPU.

usage: bench/record_h100.py --ours DIR/bench.csv --fa2 DIR/bench.csv [--record FILE]
Both inputs are bench/bench.py --out files (bench/results/README.md describes the record).
"""
import argparse
import csv
import os
import sys
import time

from suite import report
from suite.timing import time_cuda

HERE = os.path.dirname(os.path.abspath(__file__))
# bench/results/README.md describes these columns.
COLUMNS = ["pass", "dtype", "head_dim", "causal", "seqlen", "ours_tflops", "cudnn_tflops", "fa2_tflops",
           "cublas_tflops", "commit", "date", "device"]


def cublas_tflops(torch, n=8192):
    """TFLOP/s of one bf16 n x n x n torch.matmul (cuBLAS), median of timed calls."""
    g = torch.Generator(device="cuda").manual_seed(n)
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    ms = time_cuda(torch, lambda: torch.matmul(a, b))
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


def tflops_by_key(path, impl):
    """{(direction, dtype, hdim, causal, seqlen): tflops or ""} of impl's rows in a bench.csv."""
    with open(path, newline="") as f:
        return {(r["direction"], r["dtype"], r["hdim"], r["causal"], r["seqlen"]): r["tflops"]
                for r in csv.DictReader(f) if r["impl"] == impl}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", required=True, help="bench.csv of the run with FLASHATTN_CUDA_FORWARD=fa3 and cudnn")
    ap.add_argument("--fa2", required=True, help="bench.csv of the run with FLASHATTN_CUDA_FORWARD=fa2")
    ap.add_argument("--record", default=os.path.join(HERE, "results", "h100.csv"))
    a = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to record")
        return 2
    ours, cudnn = tflops_by_key(a.ours, "lib-flash"), tflops_by_key(a.ours, "cudnn")
    fa2 = tflops_by_key(a.fa2, "lib-flash")
    if not ours:
        print(f"{a.ours} has no lib-flash rows: nothing to record")
        return 1
    cublas = f"{cublas_tflops(torch):.1f}"
    device = torch.cuda.get_device_name()
    stamp, commit = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), report.commit()
    new = not os.path.exists(a.record) or os.path.getsize(a.record) == 0
    with open(a.record, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(COLUMNS)
        for key, tf in ours.items():
            w.writerow([*key, tf, cudnn.get(key, ""), fa2.get(key, ""), cublas, commit, stamp, device])
    print(f"cuBLAS bf16 8192^3: {cublas} TFLOP/s; {len(ours)} rows appended to {a.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
