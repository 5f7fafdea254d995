"""Shared test helpers: run the real command line in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


def cli_env() -> dict:
    """Environment for a subprocess that must import this checkout's pipesched."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("COLUMNS", "160")
    return env


def run_cli(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``pipesched ARGS`` through the console-script entry point (``python -m pipesched``)."""
    return subprocess.run(
        [sys.executable, "-m", "pipesched", *args],
        capture_output=True, text=True, timeout=timeout, env=cli_env(), cwd=cwd,
    )


@pytest.fixture
def cli():
    return run_cli
