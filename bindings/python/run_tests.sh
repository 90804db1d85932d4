#!/bin/sh
# Runs the Python binding's pytest suite against one libflashattn (used by CTest).
#   sh bindings/python/run_tests.sh /path/to/libflashattn.so.0 [pytest args...]
# Uses the first of $FLASHATTN_PYTHON, /usr/bin/python3, python3 (PATH) that can import
# numpy and pytest; with none, prints a skip line and exits 77 (CTest SKIP_RETURN_CODE).
set -u
if [ $# -lt 1 ]; then
  echo "usage: $0 LIBRARY_PATH [pytest args...]" >&2
  exit 2
fi
lib=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
for py in "${FLASHATTN_PYTHON:-}" /usr/bin/python3 python3; do
  [ -n "$py" ] || continue
  command -v "$py" >/dev/null 2>&1 || continue
  if "$py" -c "import numpy, pytest" >/dev/null 2>&1; then
    echo "python binding: $("$py" -c 'import sys, numpy, pytest; print(sys.executable, sys.version.split()[0], "numpy", numpy.__version__, "pytest", pytest.__version__)')"
    FLASHATTN_LIBRARY=$lib PYTHONDONTWRITEBYTECODE=1 exec "$py" -m pytest -q -rs -p no:cacheprovider "$here/tests" "$@"
  fi
done
echo "SKIPPED: no python3 that can import numpy and pytest (Debian: apt-get install python3-numpy python3-pytest)"
exit 77
