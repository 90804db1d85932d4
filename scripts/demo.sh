#!/usr/bin/env bash
# Sets up, builds and runs libflashattn's command-line tool: the README's first command.
#   bash scripts/demo.sh
# - installs missing build tools (scripts/setup.sh --minimal; apt-get as root or via sudo);
# - builds the library and the `flashattn` tool in build/demo: with the CUDA backend when
#   nvcc and a GPU are both present, else CPU only (fast, works on any machine);
# - runs `flashattn info`, two `flashattn check` runs (forward + backward against an fp64
#   reference) and a short CPU `flashattn bench`; on a GPU also a CUDA check and bench.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
run() { printf '\n$ %s\n' "$*"; "$@"; }

bash scripts/setup.sh --minimal

# shellcheck source=scripts/nvcc.sh
source scripts/nvcc.sh
cuda=OFF
configure_args=()
if [[ -n "$NVCC" ]] && nvidia-smi -L >/dev/null 2>&1; then
  cuda=ON
  configure_args=(-DCMAKE_CUDA_COMPILER="$NVCC")
  echo "demo: nvcc and a GPU found: building the CUDA backend too (this takes several minutes)"
else
  echo "demo: building the CPU backend (the CUDA backend needs nvcc and a GPU here)"
fi

cmake -S . -B build/demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_ENABLE_CUDA=$cuda \
  -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_DOCS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF "${configure_args[@]}"
cmake --build build/demo --target flashattn_cli --parallel "$(nproc)"
fa=build/demo/cli/flashattn

run "$fa" info
# GQA, causal with bottom-right alignment, seqlen_q != seqlen_k, forward and backward.
run "$fa" check --backend cpu --dtype fp16 --heads-q 8 --heads-kv 2 --causal=bottom-right \
  --seqlen-q 200 --seqlen-k 300 --bwd
# Sliding window, ALiBi, softcap and dropout together, in bf16.
run "$fa" check --backend cpu --dtype bf16 --window 64,0 --alibi --softcap 30 --dropout 0.1 --seed 3 \
  --seqlen-q 256 --bwd
run "$fa" bench --backend cpu --seqlens 256,512,1024 --tokens 1024 --heads 4 --head-dim 64 --dtype fp32 \
  --algorithm both --repeats 3 --warmup 1
if [[ $cuda == ON ]]; then
  run "$fa" check --backend cuda --dtype bf16 --causal --seqlen-q 1000 --bwd
  run "$fa" bench --backend cuda --seqlens 1024,4096,16384 --causal --bwd
fi
echo
echo "demo: done. Next: 'bash scripts/test.sh' builds everything and runs the test suite."
