#!/bin/sh
# What the torch path needs a GPU for, in one run (torch with CUDA, a CUDA build):
#   sh bindings/python/benchmarks/gpu_check.sh build/default/libflashattn.so.0
# 0. builds the compiled eager path (flashattn.torch_ext) for this torch;
# 1. per-call cost beside SDPA (forward, forward + backward; target <= 1.2x), the Python
#    path and the compiled one timed alternately, also with attention dropout 0.1 and
#    with the batch packed as varlen (cu_seqlens);
# 2. the CUDA pytest cases: CUDA-graph capture, torch.compile(mode="reduce-overhead"),
#    the FA2 functions and autocast against SDPA, flash_attn_with_kvcache against the CPU
#    backend (a visible skip while CUDA answers NOT_SUPPORTED), the older GPU cases of
#    test_torch.py, the compiled path against the Python path (test_torch_ext.py);
# 3. the tiny Llama trained with SDPA and with libfa under bf16 autocast (losses within
#    1e-3 relative), without and with padded batches, when transformers imports;
# 4. GPT-2 small training steps with SDPA and with libfa (through flashattn.hf and the
#    compiled op), attention dropout 0.1 (GPT-2's default) and 0: the throughput ratio
#    libfa / sdpa (target: binding work <= 2% of a step), when transformers imports.
set -u
lib=${1:?usage: $0 LIBRARY_PATH}
here=$(cd "$(dirname "$0")" && pwd)
py=${FLASHATTN_PYTHON:-python3}
export FLASHATTN_LIBRARY=$lib PYTHONDONTWRITEBYTECODE=1
status=0
PYTHONPATH="$here/..${PYTHONPATH:+:$PYTHONPATH}" "$py" -m flashattn.torch_ext build || status=1
"$py" "$here/overhead.py" --device cuda || status=1
"$py" "$here/overhead.py" --device cuda --causal --shape 8,128,16,64 || status=1
"$py" "$here/overhead.py" --device cuda --causal --shape 8,128,16,64 --dropout 0.1 || status=1
"$py" "$here/overhead.py" --device cuda --causal --shape 8,128,16,64 --varlen || status=1
"$py" -m pytest -q -rs -p no:cacheprovider "$here/../tests/test_torch_cuda.py" "$here/../tests/test_torch.py" \
  "$here/../tests/test_torch_ext.py" || status=1
if "$py" -c "import transformers" 2>/dev/null; then
  "$py" "$here/../examples/train_tiny_llama.py" --device cuda --bf16 --steps 20 || status=1
  "$py" "$here/../examples/train_tiny_llama.py" --device cuda --bf16 --steps 20 --padding || status=1
  for p in 0.1 0; do
    "$py" "$here/train_step.py" --device cuda --model gpt2 --attn-dropout $p --steps 10 --warmup 2 || status=1
  done
else
  echo "SKIPPED: transformers is not importable (tiny Llama comparison, GPT-2 training steps)"
fi
exit $status
