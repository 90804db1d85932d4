#!/usr/bin/env bash
# Installs what building and testing libflashattn needs on Debian 12 / Ubuntu 24.04.
#   bash scripts/setup.sh            everything the test suite uses
#   bash scripts/setup.sh --minimal  just enough to build the library and the CLI
# Runs apt-get only when a package is missing, as root or through sudo. CUDA is not
# installed here: with nvcc present (PATH or /usr/local/cuda) the CUDA backend is built.
set -euo pipefail

packages=(cmake ninja-build g++ gcc make pkg-config)
if [[ "${1:-}" != "--minimal" ]]; then
  # catch2: tests; doxygen: docs; abigail-tools: ABI check; dpkg-dev, file, lintian:
  # Debian packages (CPack's shlibdeps) and their check; python3-*: the Python binding
  # (python3-venv: the wheel test installs the built wheel into a fresh venv).
  packages+=(catch2 doxygen abigail-tools dpkg-dev file lintian python3 python3-numpy python3-pytest python3-venv)
  # clang + its runtimes: the libFuzzer target (tests/reliability) with ASan+UBSan;
  # clang-format-14: the format check (scripts/check_format.sh).
  packages+=(clang libclang-rt-14-dev clang-format-14)
  # cargo (+ rustc) and librust-half-dev: the Rust binding's tests, offline (the half crate
  # for its feature `half` comes from /usr/share/cargo/registry; bindings/rust/cargo_env.sh).
  packages+=(cargo librust-half-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "setup: all build dependencies present"
  exit 0
fi

if [[ $(id -u) -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "setup: missing packages: ${missing[*]}" >&2
  echo "setup: not root and no sudo: install them, then run this again" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update
"${as_root[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
