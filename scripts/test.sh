#!/usr/bin/env bash
# The test command: sets up .venv on first use, then runs the whole suite (extra args go to pytest).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ensure_env "torch,dev,png,hf,data"
cd "$ROOT"
# The HTML report test renders the page in headless Chromium: install it where we may (root with
# apt-get), quietly and time-bounded. Never fatal: without chromium that one test skips.
if ! command -v chromium >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "pipesched: installing chromium for the browser test (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    { timeout 300 apt-get install -y -q chromium >/dev/null 2>&1 \
        || { timeout 120 apt-get update -q >/dev/null 2>&1 \
             && timeout 300 apt-get install -y -q chromium >/dev/null 2>&1; }; } \
        || echo "pipesched: could not install chromium; the browser test will skip" >&2
fi
# Two test files at a time (pytest-xdist; PIPESCHED_TEST_WORKERS to change it, 0 for none): most
# tests are one process and leave a second core idle. A file stays on one worker (--dist
# loadfile), so a module's shared launch runs once.
WORKERS="${PIPESCHED_TEST_WORKERS:-2}"
exec "$PY" -m pytest -q -n "$WORKERS" --dist loadfile "$@"
