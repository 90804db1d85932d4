#!/usr/bin/env bash
# Nsight Compute (full section set) of one call's main kernel: the library's against
# FlashAttention-2's (PyTorch SDPA flash) at the same shape, for a side-by-side reading of
# instruction counts, stall reasons and memory traffic. Needs a GPU, ncu and PyTorch.
#
# usage: bench/ncu_compare.sh   (environment: LIB=<libflashattn.so.0>, DIR=bwd|fwd,
#                                D=head dim, S=seqlen, OUT=output folder)
# Writes <OUT>/ncu_<dir>.ncu-rep, ncu_<dir>_details.txt (every section of both kernels)
# and ncu_<dir>_sass.csv.gz (per-SASS-instruction executed counts and stall samples).
set -u -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LIB=${LIB:-$ROOT/build-gpu/libflashattn.so.0}
DIR=${DIR:-bwd}
D=${D:-128}
S=${S:-4096}
OUTD=${OUT:-$ROOT/ncu-out}
mkdir -p "$OUTD"
case "$DIR" in
  bwd) KERNELS='bwd_main_kernel|flash_bwd_dq_dk_dv'; SKIP=0 ;;
  fwd) KERNELS='fwd_kernel'; SKIP=1 ;;  # the library's set-up forward is skipped
  *) echo "DIR must be bwd or fwd" >&2; exit 2 ;;
esac
REP=$OUTD/ncu_$DIR
# One launch of each: the library runs first, then SDPA flash (bench.py --profile's order).
ncu --set full --import-source no --kernel-name "regex:$KERNELS" --launch-skip "$SKIP" --launch-count 2 -f -o "$REP" \
  python3 "$ROOT/bench/bench.py" --profile --bare --iters 1 --dir "$DIR" --hdims "$D" --seqlens "$S" \
  --impls lib-flash,flash --lib "$LIB" || exit 1
ncu --import "$REP.ncu-rep" --page details > "${REP}_details.txt"
ncu --import "$REP.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "${REP}_sass.csv.gz"
grep -E '^  [a-z_:]|Duration|Executed Instructions  |Registers Per|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|Bank Conflicts|Achieved Occupancy' \
  "${REP}_details.txt" | head -80
