# Sourced by the scripts: sets NVCC to the CUDA compiler, or to "" when there is none
# (PATH first, then the toolkit's usual places) or when FLASHATTN_CUDA=OFF is set in the
# environment (a CPU-only build on a machine that has nvcc).
NVCC=""
if [[ "${FLASHATTN_CUDA:-}" != "OFF" ]]; then
  for candidate in "$(command -v nvcc 2>/dev/null || true)" /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then
      NVCC=$candidate
      break
    fi
  done
fi
