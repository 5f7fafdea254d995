"""Shared test helpers: run the real command line in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"

# Each command a test runs (hundreds of processes: console scripts, launchers, their ranks)
# imports this checkout's pipesched from source. Where PYTHONDONTWRITEBYTECODE is set, as many
# container images set it, every one of them compiles pipesched again: about half of a refused
# command's start (0.46 s -> 0.24 s). The tests' children cache the bytecode in the checkout's
# __pycache__ folders (git ignores them) instead; this process keeps its own setting.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# pytest-xdist's workers (scripts/test.sh runs two) start with COLUMNS=80 and LINES=24 set: the
# commands the tests run see a plain pytest run's environment instead (each test that needs a
# width sets it: cli_env's 160, test_cli_tables' 80)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

T = TypeVar("T")
R = TypeVar("R")


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


@pytest.fixture(scope="session")
def forked_cli() -> Iterator[Callable[..., subprocess.CompletedProcess]]:
    """``run_cli`` for the tests of what a command computes: the command forked from one process
    of this pytest worker that imported torch and transformers once (tests/zygote.py), where its
    own process would pay 5-7 s of CPU for them first. Not for a test of how a command starts,
    stops or is signalled, nor of what it imports."""
    from zygote import Zygote

    started: list = []
    starting = threading.Lock()  # the first callers may be threads of one test (concurrently)

    def run(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
        with starting:
            if not started:  # started by the first test that asks
                started.append(Zygote(cli_env()))
        return started[0].run(["pipesched", *args], str(cwd or os.getcwd()), cli_env(), timeout)

    yield run
    for zygote in started:
        zygote.close()


# A command typed at a terminal gets Ctrl-C delivered and handled by default. A child of the test
# process inherits its SIGINT state instead, which a shell may have set to ignored (a background
# job's) or an earlier test left blocked: restore the terminal's defaults, then become the command.
_AS_FROM_A_TERMINAL = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); os.execv(sys.argv[1], sys.argv[1:])"
)


def as_from_a_terminal(argv: list[str]) -> list[str]:
    """``argv`` started with a terminal's SIGINT handling (same process id, for signalling it)."""
    return [sys.executable, "-c", _AS_FROM_A_TERMINAL, *argv]


def concurrently(run: Callable[[T], R], rows: Iterable[T], workers: int = 4) -> list[R]:
    """``run`` over ``rows``, ``workers`` at a time, results in row order.

    For tables of commands: each row is its own process and pays Python's start (and typer's or
    torch's import) before it does anything, one core each; a few at a time keep every core
    busy while pytest itself waits on one.
    """
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run, rows))


# --- the order files run in (scripts/test.sh: pytest-xdist, two workers, a file on one) ---------


def pytest_configure(config) -> None:
    """Keep the files in :func:`pytest_collection_modifyitems`' order under ``--dist loadfile``.
    pytest-xdist would hand out the files with the most tests first, which puts the multi-process
    files of one to three tests (a launch of four or eight ranks each, a minute or more) last: one
    worker then runs them alone while the other has nothing left."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items) -> None:
    """The files with a ``slow`` test first (each in its own collection order), then the rest: the
    long ones start while plenty of short files remain to fill in beside them, so the two workers
    end close together (the longest-first rule for balancing)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
