#!/usr/bin/env bash
# Checks every CPU kernel instruction set this host has (baseline, avx2, avx512, amx; see
# FLASHATTN_CPU_ISA in include/flashattn.h) and measures the CPU backend beside PyTorch:
#   1. builds the `cpu` preset (-j of this host's cores),
#   2. runs the library's CPU tests once per usable set with FLASHATTN_CPU_ISA forcing it
#      (results are compared with the fp64 reference), then the whole suite once,
#   3. runs bench/cpu/vs_torch.py at 16 threads and at 2 threads (rows appended to
#      bench/results/cpu.csv; the host column is this host's name plus its best set).
# usage: scripts/cpu_isa_check.sh [--python PATH] [--no-bench] [-- extra vs_torch.py args]
#   --python PATH  the Python with torch (default: python3)
# Exits nonzero if any test fails. Meant for the 16-core AVX-512 GPU host; a set the CPU
# lacks is reported and skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=python3
bench=1
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --python) python="$2"; shift 2 ;;
    --no-bench) bench=0; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "cpu_isa_check.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

cmake --preset cpu
cmake --build --preset cpu -j "$(nproc)"
cli=build/cpu/cli/flashattn
"$cli" info --no-probe

usable=()
for isa in baseline avx2 avx512 amx; do
  if FLASHATTN_CPU_ISA=$isa "$cli" info --no-probe | grep -q "forced by FLASHATTN_CPU_ISA"; then
    usable+=("$isa")
  else
    echo "== $isa: not usable on this CPU (skipped)"
  fi
done

status=0
for isa in "${usable[@]}"; do
  echo "== CPU suite with FLASHATTN_CPU_ISA=$isa"
  FLASHATTN_CPU_ISA=$isa ctest --test-dir build/cpu -j "$(nproc)" --output-on-failure \
    -LE 'packaging|bindings|examples|julia|fuzz|gpu|cpu_isa' || status=1
done
echo "== the whole CPU suite (best set)"
ctest --test-dir build/cpu -j "$(nproc)" --output-on-failure -LE 'fuzz' || status=1

if [[ $bench == 1 ]]; then
  host="$(hostname)-${usable[-1]}"
  for threads in 16 2; do
    echo "== bench/cpu/vs_torch.py, $threads threads"
    "$python" bench/cpu/vs_torch.py --lib build/cpu/libflashattn.so --threads "$threads" --host "$host" \
      "${extra[@]}" || status=1
  done
fi
exit $status
