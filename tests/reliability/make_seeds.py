#!/usr/bin/env python3
"""Writes the committed seed corpus of fuzz_plan.cpp: byte strings that follow the
fuzzer's reader order to reach successful forward/backward runs with various options.
The fuzzer mutates from there; rerun this only when the reader order changes."""
import os

here = os.path.dirname(os.path.abspath(__file__))

def dim(v):
    # dim(lo, hi) decodes byte c < 200 as lo + c % (hi - lo + 1) (lo = 1 for shapes), and
    # 200 <= c < 236 as a log-uniform draw: bit length, 8 bytes of lower bits, sign byte
    if v <= 200:
        return [v - 1]
    n = v.bit_length()
    return [200, n] + list((v - (1 << (n - 1))).to_bytes(8, "big")) + [1]

def shape(b, sq, sk, hkv, g, dqk, dv):
    # op 0
    return [0] + dim(b) + dim(sq) + dim(sk) + dim(hkv) + dim(g) + [1] + dim(dqk) + dim(dv)

def dtype(d): return [1, d]
def band(align, wl, wr): return [4, align, wl + 8, wr + 8]
def softcap(idx): return [5, idx]
def dropout(idx): return [7, idx] + [0] * 7 + [42] + [0] * 8
def bias(kind, bcast_mask=0): return [6, kind, 1, bcast_mask]
def varlen(en): return [9, en, 0, 0, 0]  # enable, not huge, totals b*sq and b*sk
def algorithm(a): return [11, a]
def query(pass_): return [14, pass_]
def fwd(): return [12, 1] + [3] * 8 + [0, 1]       # magnitude 1, slopes, fault 0, lse on
def bwd(): return [13, 1] + [3] * 8 + [0, 1, 1]

seeds = {
    "dense_fp32": [1] + [0] * 8 + shape(2, 17, 23, 1, 2, 16, 16) + dtype(2) + fwd() + bwd(),
    "causal_br_fp16": [1] + [0] * 8 + shape(1, 30, 12, 2, 1, 24, 8) + band(1, -1, 0) + fwd() + bwd(),
    "window_bf16_softcap": [1] + [0] * 8 + shape(3, 9, 33, 1, 1, 40, 40) + dtype(1) + band(0, 4, 2)
    + softcap(4) + fwd() + bwd(),
    "dropout_alibi": [1] + [0] * 8 + shape(1, 20, 20, 1, 2, 8, 8) + dtype(2) + dropout(2) + bias(2)
    + fwd() + bwd(),
    "bias_bcast": [1] + [0] * 8 + shape(2, 11, 13, 1, 1, 8, 8) + dtype(2) + bias(1, 0b0101) + fwd()
    + bwd(),
    "varlen": [1] + [0] * 8 + shape(3, 10, 12, 1, 1, 8, 8) + dtype(2) + varlen(1) + fwd() + bwd(),
    "sparse": [1] + [0] * 8 + shape(1, 40, 40, 1, 2, 16, 16) + dtype(2)
    + [8, 7, 9, 1, 0, 0, 1] + [1, 0, 3, 1] * 30 + fwd() + bwd(),
    # Huge shapes are only queried (issue 14): the STANDARD scores of 1.2e9 x 1.2e9 fit the
    # forward's workspace but not the backward's; a bias tensor on the flash path.
    "huge_standard": [1] + [0] * 8 + shape(1, 1235713963, 1244000330, 1, 1, 1, 1) + algorithm(1)
    + softcap(4) + query(0) + query(1) + fwd() + bwd(),
    "huge_bias": [1] + [0] * 8 + shape(1, 1518500249, 1518500249, 1, 1, 256, 256) + bias(1, 0b0011)
    + query(0) + query(1) + algorithm(1) + query(1),
}
os.makedirs(os.path.join(here, "corpus"), exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(here, "corpus", name), "wb") as f:
        f.write(bytes(x & 0xFF for x in data))
print(f"wrote {len(seeds)} seeds")
