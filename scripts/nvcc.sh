# Sourced by the scripts: sets NVCC to the CUDA compiler, or to "" when there is none
# (PATH first, then the toolkit's usual places).
NVCC=""
for candidate in "$(command -v nvcc 2>/dev/null || true)" /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
  if [[ -n "$candidate" && -x "$candidate" ]]; then
    NVCC=$candidate
    break
  fi
done
