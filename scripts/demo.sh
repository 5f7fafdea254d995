#!/usr/bin/env bash
# The main job: sets up .venv on first use, then runs the demo (compare, draw, train on CPU).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ensure_env "torch"
cd "$ROOT"
exec "$VENV/bin/pipesched" demo "$@"
