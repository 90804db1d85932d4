#!/usr/bin/env python3
"""Decode latency of flashattn_fwd_kvcache on the GPU beside PyTorch SDPA's cudnn and flash
backends, in one process, against the memory-bandwidth bound.

One query token per sequence against `keys` cached keys (all used), contiguous or paged
(pages of `page_size` tokens in a shuffled pool), bf16. The bound is the K+V bytes read
over the device copy rate measured here (bytes read + written per second by a large
device-to-device copy). SDPA runs on the contiguous equivalent ([b, h, keys, d] views,
GQA through enable_gqa). Inputs rotate over enough copies to exceed the L2 cache.

    python bench/decode.py [--grid small|pages|dims|batch|issue] [--out bench/results/h100-decode.csv]

Appends b,heads_q,heads_kv,d,keys,page_size,ours_us,sdpa_best_us,bound_us,commit,date,device rows
to --out and prints them with the ratios. The library is found as bench/bench.py finds it
(bench/suite/library.py: --library, $FLASHATTN_LIBRARY, or this checkout's newest build).
"""
import argparse
import ctypes
import csv
import datetime
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from suite import library, report  # noqa: E402
from suite.timing import sdpa_backend, short, time_cuda  # noqa: E402

COLUMNS = ["b", "heads_q", "heads_kv", "d", "keys", "page_size", "ours_us", "sdpa_best_us", "bound_us", "commit",
           "date", "device"]
GRIDS = {
    # scripts/gpu_decode_check.sh: b 1/8/64, heads 32/8 and 32/32, d 128, 4k/32k keys, contiguous and pages of 16.
    "small": dict(b=[1, 8, 64], heads=[(32, 8), (32, 32)], d=[128], keys=[4096, 32768], page=[0, 16]),
    # Page sizes at batch 1 and 8 (d 128, GQA 32/8): the copy engine's boxes of 16, 32 and 64 keys.
    "pages": dict(b=[1, 8], heads=[(32, 8)], d=[128], keys=[4096, 32768], page=[0, 16, 32, 64, 256]),
    # Every padded head dim and a larger page, at one mid-size shape.
    "dims": dict(b=[8], heads=[(32, 8)], d=[64, 128, 256], keys=[32768], page=[0, 64]),
    # Batch 1 and 8 over the heads, dims, cache lengths and page sizes: the split rule's sweep.
    "batch": dict(b=[1, 8], heads=[(32, 8), (64, 8), (32, 32)], d=[64, 128, 256], keys=[4096, 32768, 131072],
                  page=[0, 16, 64, 256]),
    # The targets of issue 19.
    "issue": dict(b=[1, 8, 64], heads=[(32, 8), (64, 8), (32, 32)], d=[64, 128, 256],
                  keys=[4096, 16384, 32768, 131072], page=[0, 16, 64, 256]),
}
L2_SPAN = 256 << 20  # bytes of inputs cycled through per shape, well past any L2


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", choices=sorted(GRIDS), default="small")
    ap.add_argument("--out", default=os.path.join(library.REPO, "bench", "results", "h100-decode.csv"))
    ap.add_argument("--library", help="libflashattn.so to load (default: as bench/bench.py)")
    ap.add_argument("--max-gib", type=float, default=60.0,
                    help="skip shapes whose K+V (twice that when paged: SDPA gets a gathered copy) exceed this many GiB")
    return ap.parse_args(argv)


def copy_rate(torch):
    """Bytes per second (read + written) of a 1 GiB device-to-device copy."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_cuda(torch, lambda: dst.copy_(src), min_iters=10)
    return 2 * n / (ms * 1e-3)


class Decode:
    """One decode shape: caches (several copies), a KV-cache plan and the timed call."""

    def __init__(self, fa, torch, b, hq, hkv, d, keys, page):
        self.torch, self.L = torch, fa._lib
        L, dev = self.L, "cuda"
        kv_bytes = 2 * b * keys * hkv * d * 2
        self.copies = max(1, min(8, -(-L2_SPAN // kv_bytes)))
        g = torch.Generator(device=dev).manual_seed(b * 7 + keys)
        self.q = [torch.randn(b, 1, hq, d, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(self.copies)]
        self.o = torch.empty(b, 1, hq, d, device=dev, dtype=torch.bfloat16)
        self.lse = torch.empty(b, hq, 1, device=dev, dtype=torch.float32)
        self.seqlens = torch.full((b,), keys, dtype=torch.int32, device=dev)
        if page == 0:
            shape = (b, keys, hkv, d)
            self.table = None
            rows = b
        else:
            pages = keys // page
            rows = b * pages
            shape = (rows, page, hkv, d)
            perm = torch.randperm(rows, device=dev, generator=g).to(torch.int32)
            self.table = perm.view(b, pages).contiguous()
        self.k = [torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(self.copies)]
        self.v = [torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(self.copies)]
        handle = ctypes.c_void_p()
        L.call("flashattn_plan_create", ctypes.byref(handle), 2, torch.cuda.current_device())  # CUDA
        self.handle = handle
        L.call("flashattn_plan_set_shape", handle, b, 1, keys, hq, hkv, d, d)
        L.call("flashattn_plan_set_dtype", handle, 1)  # BF16
        self.cfg = L.KvcacheConfig(page_size=page, num_rows=rows, max_pages_per_seq=keys // page if page else 0)
        L.call("flashattn_plan_set_kvcache", handle, ctypes.byref(self.cfg))
        nbytes = ctypes.c_size_t()
        L.call("flashattn_plan_get_workspace_size", handle, 2, ctypes.byref(nbytes))
        self.ws = torch.empty(max(nbytes.value, 1), dtype=torch.uint8, device=dev)
        self.args = [L.KvcacheArgs(q=self.q[i].data_ptr(), k_cache=self.k[i].data_ptr(), v_cache=self.v[i].data_ptr(),
                                   o=self.o.data_ptr(), lse=self.lse.data_ptr(), cache_seqlens=self.seqlens.data_ptr(),
                                   block_table=None if self.table is None else self.table.data_ptr())
                     for i in range(self.copies)]
        self.fn = L.lib().flashattn_fwd_kvcache
        self.stream = torch.cuda.current_stream().cuda_stream
        self.turn = 0

    def __call__(self):
        i = self.turn % self.copies
        self.turn += 1
        self.L.check(self.fn(self.handle, ctypes.byref(self.args[i]), self.ws.data_ptr(), self.ws.numel(),
                             self.stream), "flashattn_fwd_kvcache")

    def dense(self, i):
        """Copy i as contiguous BSHD K and V (the paged pool gathered through the table)."""
        if self.table is None:
            return self.k[i], self.v[i]
        b, pages = self.table.shape
        idx = self.table.long().flatten()
        return (x[idx].reshape(b, pages * x.shape[1], x.shape[2], x.shape[3]) for x in (self.k[i], self.v[i]))

    def close(self):
        self.L.lib().flashattn_plan_destroy(self.handle)


def sdpa_times(torch, dec, hq, hkv):
    """{backend: ms} of SDPA on copies of dec's inputs, and the largest |O - ours| (first copy)."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    views = []
    for i in range(dec.copies):
        k, v = dec.dense(i)
        views.append(tuple(x.transpose(1, 2) for x in (dec.q[i], k, v)))
    out, err = {}, None
    for name in ("cudnn", "flash"):
        turn = itertools.count()

        def call():
            q, k, v = views[next(turn) % len(views)]
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)
        try:
            with sdpa_kernel([sdpa_backend(torch, name)]):
                ref = call()
                out[name] = time_cuda(torch, call)
            if err is None:
                dec.turn = 0
                dec()
                torch.cuda.synchronize()
                err = (dec.o.transpose(1, 2).float() - ref.float()).abs().max().item()
        except RuntimeError as e:
            print(f"  sdpa {name}: {short(e)}")
    return out, err


def main(argv=None):
    args = parse_args(argv)
    import torch
    fa = library.load(args.library)
    print(f"library {fa.library_path()}; device {torch.cuda.get_device_name()}")
    rate = copy_rate(torch)
    print(f"device copy rate {rate / 1e12:.2f} TB/s (read + write)")
    commit = report.commit()
    device = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    grid = GRIDS[args.grid]
    new_file = not os.path.exists(args.out)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "a", newline="") as f:
        w = csv.writer(f)
        if new_file:
            w.writerow(COLUMNS)
        for b, (hq, hkv), d, keys, page in itertools.product(grid["b"], grid["heads"], grid["d"], grid["keys"],
                                                             grid["page"]):
            kv_bytes = 2 * b * keys * hkv * d * 2
            if kv_bytes * (2 if page else 1) > args.max_gib * (1 << 30):
                print(f"skip b={b} {hq}/{hkv} d={d} keys={keys}: {kv_bytes / 2**30:.1f} GiB of K+V")
                continue
            dec = Decode(fa, torch, b, hq, hkv, d, keys, page)
            try:
                # A freshly allocated cache reads slower for its first calls (b=64 32/8 d=128 4k:
                # 433 us, then 369 us in the next timings: docs/internals/kernels-decode.md), and
                # SDPA reads it after us: that first timing is discarded.
                time_cuda(torch, dec)
                ours = time_cuda(torch, dec)
                sdpa, err = sdpa_times(torch, dec, hq, hkv)
            finally:
                dec.close()
            bound = kv_bytes / rate * 1e3
            best = min(sdpa.values()) if sdpa else float("nan")
            row = [b, hq, hkv, d, keys, page, f"{ours * 1e3:.1f}", f"{best * 1e3:.1f}", f"{bound * 1e3:.1f}", commit,
                   date, device]
            w.writerow(row)
            f.flush()
            print(f"b={b:<3} {hq}/{hkv} d={d} keys={keys:<6} page={page:<3} ours {ours * 1e3:8.1f} us  "
                  f"sdpa {best * 1e3:8.1f} us ({', '.join(f'{k} {v * 1e3:.1f}' for k, v in sdpa.items())})  "
                  f"bound {bound * 1e3:7.1f} us  {bound / ours:5.1%} of bound  {best / ours:4.2f}x sdpa  "
                  f"max|O-sdpa| {err if err is not None else float('nan'):.3g}")
            del dec
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
