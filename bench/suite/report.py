"""What a run leaves behind: the record in bench/results/ (one CSV row per measured
configuration, appended as it is measured), the run's own files in --out (bench.csv,
bench.json, bench.png) and the table printed at the end."""
import csv
import json
import os
import subprocess

from .library import REPO
from .timing import hdim_order

SWEEP_KEYS = ["dtype", "hdim", "causal", "seqlen", "batch", "heads", "impl", "direction", "ms", "tflops", "error"]
# bench/results/README.md describes these columns.
RECORD_KEYS = ["time", "commit", "device", "library", "torch"] + SWEEP_KEYS


def commit():
    """The checkout's commit, with -dirty when tracked files outside bench/results differ;
    FLASHATTN_COMMIT names it where the tree is no git checkout (an exported copy)."""
    if os.environ.get("FLASHATTN_COMMIT"):
        return os.environ["FLASHATTN_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "diff", "--quiet", "HEAD", "--", ".", ":!bench/results"]).returncode
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class Record:
    """Appends rows to a CSV of bench/results (header written when the file is new)."""

    def __init__(self, path, meta):
        self.path = path
        self.fixed = dict(time=meta["time"], commit=meta["commit"], device=meta["device"], library=meta["lib"],
                          torch=meta["torch"])

    def append(self, row):
        if not self.path:
            return
        new = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        with open(self.path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=RECORD_KEYS)
            if new:
                w.writeheader()
            w.writerow({k: {**self.fixed, **row}.get(k) for k in RECORD_KEYS})


def write_outputs(out_dir, rows, memory, sparse, verify_res, meta):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SWEEP_KEYS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in SWEEP_KEYS})
    with open(os.path.join(out_dir, "bench.json"), "w") as f:
        json.dump(dict(meta=meta, sweep=rows, memory=memory, sparse=sparse,
                       verify=[dict(name=n, ok=ok, detail=d) for n, ok, d in (verify_res or [])]), f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not importable; skipping bench.png")
        return
    combos = sorted({(r["dtype"], r["hdim"], r["causal"]) for r in rows}, key=lambda c: (c[0], hdim_order(c[1]), c[2]))
    dirs = sorted({r["direction"] for r in rows}, reverse=True)
    if not combos:
        return
    fig, axes = plt.subplots(len(dirs), len(combos), figsize=(3.2 * len(combos), 3.0 * len(dirs)), squeeze=False)
    impls = list(dict.fromkeys(r["impl"] for r in rows))
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
    fig.savefig(os.path.join(out_dir, "bench.png"), dpi=110)
    print(f"wrote {os.path.join(out_dir, 'bench.png')}")


def print_table(rows, memory, sparse, verify_res):
    print()
    print("==== bench results")
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
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    by = {(r["dtype"], r["hdim"], r["causal"], r["seqlen"], r["direction"], r["impl"]): r for r in rows}
    print("== TFLOP/s (fwd 2*b*h*sq*sk*(d_qk+d_v), /2 causal; bwd 2.5x); ratio = lib-flash / peer; det = "
          "lib-flash-det / lib-flash")
    hdr = f"{'dtype':5} {'d':>7} {'c':>1} {'seqlen':>6} {'dir':3} " + " ".join(f"{i[:12]:>12}" for i in impls) + \
          f" {'/flash':>7} {'/cudnn':>7} {'det':>7}"
    print(hdr)
    keys = sorted({k[:5] for k in by}, key=lambda k: (k[0], hdim_order(k[1]), k[2], k[4] != "fwd", k[3]))
    for k in keys:
        cells = []
        for i in impls:
            r = by.get(k + (i,))
            cells.append(f"{r['tflops']:12.1f}" if r and r["tflops"] else f"{'err' if r and r['error'] else '-':>12}")

        def ratio(peer, ours="lib-flash"):
            a, p = by.get(k + (ours,)), by.get(k + (peer,))
            if a and p and a["tflops"] and p["tflops"]:
                return f"{a['tflops'] / p['tflops']:7.2f}"
            return f"{'-':>7}"
        print(f"{k[0]:5} {str(k[1]):>7} {k[2]:1d} {k[3]:6d} {k[4]:3} " + " ".join(cells) +
              f" {ratio('flash')} {ratio('cudnn')} {ratio('lib-flash', 'lib-flash-det')}")
