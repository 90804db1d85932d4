#!/bin/sh
# Ring attention (flashattn.distributed, issue 22) on the GPUs of one host, in one run:
#   sh bindings/python/benchmarks/ring_check.sh build/default/libflashattn.so.0 [ring_bench.py options]
# 1. correctness over NCCL: ring attention on zig-zag shards against the fp64 reference and
#    one GPU (bf16/fp16, causal and not, GQA, odd lengths);
# 2. the benchmark: bf16, head_dim 128, 16 heads, 131072 tokens in total, causal and not:
#    forward+backward time against one GPU (target >= 0.9 x GPUs), peak memory per GPU.
# Prints a table; takes about two minutes on 2 H100s. Needs torch with CUDA and NCCL
# (FLASHATTN_PYTHON, default python3) and a libflashattn built with CUDA. GPUS (default 2)
# sets --nproc_per_node.
set -u
lib=${1:?usage: $0 LIBRARY_PATH [ring_bench.py options]}
shift
here=$(cd "$(dirname "$0")" && pwd)
py=${FLASHATTN_PYTHON:-python3}
export FLASHATTN_LIBRARY=$lib PYTHONDONTWRITEBYTECODE=1
exec "$py" -m torch.distributed.run --standalone --nproc_per_node="${GPUS:-2}" "$here/ring_bench.py" "$@"
