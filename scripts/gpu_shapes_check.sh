#!/usr/bin/env bash
# GPU check of issue 20's shapes (run on a GPU machine, from a clean checkout): builds the
# library and test_gpu, runs the GPU cases of every head dim 1..256 (dqk and dv
# independent) and of ALiBi slopes per (batch, head), then times padded head dims against
# the next instantiated kernel size on the same problem (same batch, heads, seqlens):
#   72, 80, 88 -> 96 (the d=96 kernel, columns past the dim zero-filled by its loaders; on
#     compute capability 9.0 the fa3 kernels, by the copy engine, where the forward of 72
#     runs the d=128 instance: src/cuda/fa3_fwd.cpp, fa3_config),
#   100 -> 128 (zero-padded workspace copies of Q, K, V, O / dO, dQ, dK, dV at 104, run by
#     the d=128 kernel: fa3 on compute capability 9.0, fa2 elsewhere),
#   120 -> 128 (the d=128 kernel, fa3 on compute capability 9.0),
# forward and backward, bf16, causal and not, seqlen 1k/4k/8k at 16k tokens per batch and
# 16 heads. Target: each padded dim within 5% of the time of its next size up.
#
# usage: scripts/gpu_shapes_check.sh
# environment:
#   FLASHATTN_CUDA_ARCHITECTURES  CMake architecture list (default 90a-real: H100/H200)
#   BUILD_DIR                     build folder (default <repo>/build-gpu-shapes)
#   JOBS                          parallel build jobs (default 16)
#   STEPS                         comma list of build,tests,time (default all)
#   OUT                           folder that receives the logs and shapes-timing.csv
# Needs python3 with torch (CUDA) for the timing step (as bench/bench.py does).
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-gpu-shapes}
ARCHS=${FLASHATTN_CUDA_ARCHITECTURES:-90a-real}
JOBS=${JOBS:-16}
STEPS=${STEPS:-build,tests,time}
LOGS=${OUT:-$BUILD/shapes-check}
mkdir -p "$LOGS"
want() { [[ ",$STEPS," == *",$1,"* ]]; }
STATUS=0

if want build; then
  GEN=()
  command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_ENABLE_CUDA=ON \
    -DFLASHATTN_CUDA_ARCHITECTURES="$ARCHS" -DFLASHATTN_BUILD_DOCS=OFF -DFLASHATTN_BUILD_TESTS=ON \
    > "$LOGS/configure.log" 2>&1 || { echo "configure failed: $LOGS/configure.log"; exit 1; }
  cmake --build "$BUILD" -j "$JOBS" --target flashattn test_gpu test_gpu_limits > "$LOGS/build.log" 2>&1 ||
    { echo "build failed: $LOGS/build.log"; exit 1; }
fi

if want tests; then
  TEST_GPU=$(find "$BUILD" -maxdepth 3 -type f -name test_gpu -perm -u+x | head -1)
  # Catch2 test specs: commas separate names, so names with commas end in a wildcard.
  spec="gpu: every head dim 1..256*,gpu: head dims 32 to 256*,gpu: ALiBi slopes per (batch*"
  spec="$spec,gpu: masks and options at head dims 128 and 192 over several tiles"
  spec="$spec,gpu: head dim 256 over several tiles with masks and options"
  TEST_LIMITS=$(find "$BUILD" -maxdepth 3 -type f -name test_gpu_limits -perm -u+x | head -1)
  limits="gpu limits: element-aligned pointers and strides for head dims that are not a multiple of 8"
  if "$TEST_GPU" "$spec" > "$LOGS/tests.log" 2>&1 && "$TEST_LIMITS" "$limits" >> "$LOGS/tests.log" 2>&1; then
    echo "tests: OK ($(grep -E 'test cases|All tests' "$LOGS/tests.log" | tr '\n' ' '))"
  else
    echo "tests: FAIL (see $LOGS/tests.log)"
    grep -E 'FAILED|REQUIRE|CHECK' "$LOGS/tests.log" | head -20
    STATUS=1
  fi
fi

if want time; then
  FLASHATTN_LIBRARY=$BUILD/libflashattn.so.0 PYTHONPATH="$ROOT/bench" python3 - "$LOGS/shapes-timing.csv" \
    <<'EOF' 2>&1 | tee "$LOGS/timing.log"
import csv
import sys

import torch
from suite import library

fa = library.load()
pairs = [(72, 96), (80, 96), (88, 96), (100, 128), (120, 128)]
rows, worst = [], 0.0
print("%-5s %-5s %-6s %-5s %-4s %9s %9s %7s" % ("d", "next", "causal", "sq", "dir", "ms(d)", "ms(next)", "ratio"))
for causal in (False, True):
    for sq in (1024, 4096, 8192):
        b, h = 16384 // sq, 16
        for d, nxt in pairs:
            times = {}
            for dim in (d, nxt):
                g = torch.Generator(device="cuda").manual_seed(dim)
                q, k, v, do = (torch.randn(b, sq, h, dim, device="cuda", dtype=torch.bfloat16, generator=g)
                               for _ in range(4))
                times[dim] = library.bench_lib(fa, torch, "flash", q, k, v, do, causal, "bf16", ("fwd", "bwd"))
            for direction in ("fwd", "bwd"):
                a, n = times[d].get(direction), times[nxt].get(direction)
                ratio = a / n if a and n else float("nan")
                worst = max(worst, ratio)
                rows.append(dict(d=d, next=nxt, causal=causal, seqlen=sq, batch=b, heads=h, dir=direction,
                                 ms_d=a, ms_next=n, ratio=ratio))
                print("%-5d %-5d %-6s %-5d %-4s %9.3f %9.3f %7.3f%s" % (d, nxt, causal, sq, direction, a, n, ratio,
                                                                        "  > 1.05" if ratio > 1.05 else ""))
with open(sys.argv[1], "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
print("worst ratio %.3f (target <= 1.05); device %s" % (worst, torch.cuda.get_device_name()))
sys.exit(0 if worst <= 1.05 else 3)
EOF
  rc=$?
  [[ $rc == 0 ]] || { echo "timing: padded head dims above the 5% target or failed (status $rc)"; STATUS=1; }
fi
exit $STATUS
