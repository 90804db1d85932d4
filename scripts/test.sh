#!/usr/bin/env bash
# Sets up, builds and tests libflashattn: the command CI runs (.ci/run).
#   bash scripts/test.sh
# - installs missing build dependencies (scripts/setup.sh; apt-get as root or via sudo);
# - configures preset `ci` (CPU + CUDA kernels for sm_80 and sm_90a + compute_90 PTX, as shipped)
#   when nvcc exists, else `ci-cpu`, builds everything with Ninja;
# - runs the whole CTest suite: unit and reference tests, packaging tests (exports,
#   consumers of the installed library, ABI, Doxygen docs, Debian packages + lintian),
#   bindings (Python, Rust when cargo exists, Julia's tests when julia exists and its header
#   check), examples; GPU tests report "skipped" on a machine without a GPU.
# - then the CPU suite again under ASan+UBSan and the concurrency test under TSan
#   (scripts/sanitize.sh).
# Exits nonzero if anything fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS
step() { printf '\n==== %s (%ds elapsed)\n' "$*" $((SECONDS - start)); }

step "setup"
bash scripts/setup.sh

# shellcheck source=scripts/nvcc.sh
source scripts/nvcc.sh
if [[ -n "$NVCC" ]]; then
  preset=ci
  configure_args=(-DCMAKE_CUDA_COMPILER="$NVCC")
  echo "test: CUDA compiler $NVCC ($("$NVCC" --version | tail -n 1)): building the CUDA backend too"
else
  preset=ci-cpu
  configure_args=()
  echo "test: no nvcc found (or FLASHATTN_CUDA=OFF): building the CPU backend only"
fi

step "configure (preset $preset)"
cmake --preset "$preset" "${configure_args[@]}"
step "build"
cmake --build --preset "$preset" --parallel "$(nproc)"
step "test"
ctest --preset "$preset"
step "sanitizers (CPU suite under ASan+UBSan, concurrency under TSan)"
bash scripts/sanitize.sh all

if ! command -v cargo >/dev/null 2>&1 && [[ ! -x "${CARGO_HOME:-${HOME:-/nonexistent}/.cargo}/bin/cargo" ]]; then
  echo "NOTE: cargo not found: the Rust binding's tests (bindings.rust, bindings.rust_prefix) were skipped"
fi
step "all tests passed"
