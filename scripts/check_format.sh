#!/usr/bin/env bash
# The C/C++/CUDA format check (.clang-format, clang-format 14; CTest runs it as `format`).
#   scripts/check_format.sh          check the paths in scripts/format_paths.txt; exit 1 and
#                                    list the files clang-format would change
#   scripts/check_format.sh --fix    reformat those paths in place
# Without clang-format 14 (clang-format-14, or clang-format reporting version 14: other
# versions format differently) it prints a skip line and exits 77.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
fix=0
for arg in "$@"; do
  case "$arg" in
    --fix) fix=1 ;;
    *) echo "usage: $0 [--fix]" >&2; exit 2 ;;
  esac
done

cf=""
for c in clang-format-14 clang-format; do
  if command -v "$c" >/dev/null 2>&1 && "$c" --version | grep -q 'version 14\.'; then
    cf=$c
    break
  fi
done
if [[ -z "$cf" ]]; then
  echo "SKIPPED: clang-format 14 not found (Debian: apt-get install clang-format-14)"
  exit 77
fi

mapfile -t paths < <(sed -e 's/^#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' "$root/scripts/format_paths.txt")
cd "$root"
mapfile -t files < <(git ls-files -- "${paths[@]}" | grep -E '\.(c|h|cpp|hpp|cu|cuh|inl)$')
if ((${#files[@]} == 0)); then
  echo "check_format: no C/C++/CUDA files under: ${paths[*]}" >&2
  exit 1
fi
if ((fix)); then
  "$cf" -i "${files[@]}"
  echo "check_format: formatted ${#files[@]} files"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$cf" "$f" | cmp -s - "$f" || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "check_format: ${#bad[@]} of ${#files[@]} files differ from .clang-format (scripts/check_format.sh --fix):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "check_format: ${#files[@]} files match .clang-format"
