# Sourced by the README's commands: makes .venv and installs what pipesched needs, once.
# Re-installs only when pyproject.toml changes. torch is the CPU build 2.13.0 (pip takes it from
# the local wheel cache where one exists); set PIPESCHED_NO_TORCH=1 to plan without the runtime.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PIPESCHED_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"

ensure_env() {
    local extras="$1"
    local stamp="$VENV/.pipesched-installed"
    local want
    want="$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)-$extras-${PIPESCHED_NO_TORCH:-0}"
    if [[ ! -x "$PY" ]]; then
        echo "pipesched: creating $VENV" >&2
        python3 -m venv "$VENV"
    fi
    if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
        echo "pipesched: installing into $VENV (first use only)" >&2
        # an editable install of a pyproject-only package needs pip >= 21.3 (PEP 660): upgrade
        # only an older pip (a fresh venv's is new enough since Python 3.10.1; upgrading anyway
        # costs a download and a reinstall on every fresh clone)
        if ! "$PY" -c "import pip, sys; sys.exit(tuple(map(int, pip.__version__.split('.')[:2])) < (21, 3))" 2>/dev/null; then
            "$PY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
        fi
        if [[ "${PIPESCHED_NO_TORCH:-0}" != "1" ]]; then
            "$PY" -m pip install -q "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" >&2 || true
            "$PY" -c "import torch" 2>/dev/null || { echo "pipesched: installing torch==2.13.0 failed" >&2; exit 1; }
        fi
        "$PY" -m pip install -q -e "$ROOT[$extras]" 2>&1 | grep -v "^WARNING: Location" >&2 || true
        "$PY" -c "import pipesched" || { echo "pipesched: installing pipesched failed" >&2; exit 1; }
        echo "$want" > "$stamp"
    fi
}
