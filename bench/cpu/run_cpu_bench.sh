#!/usr/bin/env bash
# CPU benchmark of libflashattn: the flash CPU backend against the library's standard
# attention (STANDARD algorithm: S and P materialized, O(N^2) workspace) at
# N = 512..8192 with a fixed 8192 tokens per batch (batch = 8192 / N), forward and
# backward, fp32, head_dim 64. Each (N, algorithm, pass) runs in its own child process
# (`flashattn bench --isolate`), so its measured peak RSS is its own.
#
# usage: bench/cpu/run_cpu_bench.sh [--build-dir DIR] [--out DIR] [--quick] [--no-bwd]
#                                   [--heads N] [--repeats N] [--threads N] [-- extra bench args]
#   --build-dir DIR  use an existing build (its cli/flashattn); default: configure and
#                    build a CPU-only tree in <repo>/build-cpu-bench (-j2, CLI target only)
#   --out DIR        where bench.csv, bench.json, table.txt and summary.md go
#                    (default <repo>/build-cpu-bench/out or <build-dir>/cpu-bench)
#   --quick          N = 512,1024,2048, one timed run, no warm-up (a smoke test: seconds)
#   --no-bwd         forward only
#   --heads N        query heads (default 2: about 3 minutes on 2 idle cores at ~10 GFLOP/s)
#   --repeats N      timed runs per row, median reported (default 3; warm-up 1)
#   --threads N      FLASHATTN_CPU_THREADS for the library (default: all hardware threads)
# Anything after "--" is passed to `flashattn bench` unchanged.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build=""
out=""
quick=0
bwd=1
heads=2
repeats=3
threads=""
extra=()

die() { echo "run_cpu_bench.sh: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) need_value "$@"; build="$2"; shift 2 ;;
    --out) need_value "$@"; out="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    --no-bwd) bwd=0; shift ;;
    --heads) need_value "$@"; is_uint "$2" && [[ "$2" -ge 1 ]] || die "--heads: '$2' is not a positive integer"; heads="$2"; shift 2 ;;
    --repeats) need_value "$@"; is_uint "$2" && [[ "$2" -ge 1 ]] || die "--repeats: '$2' is not a positive integer"; repeats="$2"; shift 2 ;;
    --threads) need_value "$@"; is_uint "$2" && [[ "$2" -ge 1 ]] || die "--threads: '$2' is not a positive integer"; threads="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

if [[ -z "$build" ]]; then
  build="$repo/build-cpu-bench"
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_ENABLE_CUDA=OFF \
    -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_DOCS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$build" -j2 --target flashattn_cli
  : "${out:=$build/out}"
fi
tool="$build/cli/flashattn"
[[ -x "$tool" ]] || die "no flashattn tool at $tool (build the flashattn_cli target)"
: "${out:=$build/cpu-bench}"
mkdir -p "$out"

seqlens="512,1024,2048,4096,8192"
warmup=1
if [[ $quick -eq 1 ]]; then seqlens="512,1024,2048"; repeats=1; warmup=0; fi
args=(bench --backend cpu --algorithm both --isolate --seqlens "$seqlens" --tokens 8192
      --heads "$heads" --head-dim 64 --dtype fp32 --repeats "$repeats" --warmup "$warmup"
      --csv "$out/bench.csv" --json "$out/bench.json")
[[ $bwd -eq 1 ]] && args+=(--bwd)
args+=("${extra[@]}")
[[ -n "$threads" ]] && export FLASHATTN_CPU_THREADS="$threads"

echo "# $tool ${args[*]}" >&2
load_before="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
start=$(date +%s)
status=0
"$tool" "${args[@]}" | tee "$out/table.txt" || status=$?
elapsed=$(( $(date +%s) - start ))
load_after="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"

# Side-by-side summary: flash vs standard per (N, pass).
python3 - "$out/bench.csv" "$out/summary.md" "$elapsed" "$(nproc)" "${threads:-all}" "$("$tool" --version)" \
  "$load_before" "$load_after" <<'PY'
import csv, json, os, sys
path, md, elapsed, ncpu, threads, version, load_before, load_after = sys.argv[1:9]
rows = list(csv.DictReader(open(path)))
try:
    device = json.load(open(os.path.join(os.path.dirname(path), "bench.json")))["device"]
except (OSError, ValueError, KeyError):
    device = f"{ncpu} hardware threads"
by = {(r["seqlen"], r["pass"], r["algorithm"]): r for r in rows}
keys = sorted({(int(r["seqlen"]), r["pass"]) for r in rows}, key=lambda k: (k[1] != "fwd", k[0]))
MiB = 1024.0 * 1024.0
def g(r, k, scale=1.0, fmt="%.1f"):
    if r is None or r.get(k, "") == "": return "n/a" if r is None or not r["error"] else "error"
    return fmt % (float(r[k]) / scale)
lines = [
    f"CPU bench: {version}; {device}; FLASHATTN_CPU_THREADS={threads}; total wall time {elapsed} s; "
    f"load average before/after: {load_before} / {load_after}.",
    f"fp32, head_dim 64, {rows[0]['heads'] if rows else '?'} heads, 8192 tokens per batch (batch = 8192/N); "
    "ms = median of the timed runs; GFLOP/s from the median, (best) from the fastest run; "
    "fwd = 4*b*h*N^2*d FLOPs, bwd = 2.5x fwd.",
    "model mem = workspace + inputs/outputs (what the pass needs); RSS = measured peak resident set of a child "
    "process running only that row (extra = growth over the child's size at start).",
    "",
    "| pass | N | batch | flash ms | flash GFLOP/s (best) | standard ms | standard GFLOP/s (best) | flash/standard speed | "
    "flash mem MiB | standard mem MiB | flash RSS extra MiB | standard RSS extra MiB |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
]
for n, p in keys:
    f = by.get((str(n), p, "flash")); s = by.get((str(n), p, "standard"))
    speed = "n/a"
    if f and s and f["ms_median"] and s["ms_median"]:
        speed = "%.2fx" % (float(s["ms_median"]) / float(f["ms_median"]))
    mem = lambda r: "n/a" if r is None else "%.1f" % (float(r["peak_extra_bytes"]) / MiB)
    batch = (f or s)["batch"]
    def rate(r):
        if r is None or not r["ms_median"]: return g(r, "gflops_per_s")
        best = float(r["flops"]) / (float(r["ms_min"]) * 1e-3) / 1e9
        return "%.2f (%.2f)" % (float(r["gflops_per_s"]), best)
    lines.append(f"| {p} | {n} | {batch} | {g(f,'ms_median')} | {rate(f)} | "
                 f"{g(s,'ms_median')} | {rate(s)} | {speed} | {mem(f)} | {mem(s)} | "
                 f"{g(f,'rss_extra_bytes',MiB)} | {g(s,'rss_extra_bytes',MiB)} |")
errors = [r for r in rows if r["error"]]
for r in errors:
    lines.append(f"\nERROR {r['algorithm']} N={r['seqlen']} {r['pass']}: {r['error']}")
open(md, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "results: $out/{table.txt,bench.csv,bench.json,summary.md}" >&2
exit $status
