#!/usr/bin/env bash
# The test command: sets up .venv on first use, then runs the whole suite (extra args go to pytest).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ensure_env "torch,dev"
cd "$ROOT"
exec "$PY" -m pytest -q "$@"
