"""CPU seconds (user + sys, every child process included) of one command under two source trees.

On a shared machine wall times follow the load; CPU time of the same work does not, much. The
runs alternate between the trees (A B A B ...), and the medians and their ratio are printed:

    python benchmarks/startup_cpu.py --base ../main-checkout/src --runs 3 -- \\
        -m pipesched train --ranks 2 --steps 1 --batch-size 8
    python benchmarks/startup_cpu.py --base ../main-checkout/src --runs 3 -- \\
        -m pytest -q -p no:cacheprovider tests/test_runtime_cli.py

The command runs with this interpreter; the trees go first on PYTHONPATH (the spawned ranks
inherit it). ``--new`` defaults to this checkout's ``src``; test files run from each tree's own checkout.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def cpu_seconds(command: list[str], src: Path, cwd: Path) -> float:
    """User + sys seconds of ``command`` and every process it waited for, with ``src`` imported."""
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, *command], env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed under {src}:\n{done.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the other src tree (e.g. a checkout of main)")
    parser.add_argument("--new", type=Path, default=HERE / "src")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    times: dict[Path, list[float]] = {args.base: [], args.new: []}
    for _ in range(args.runs):
        for src in times:  # the tests run from the tree's own checkout (its tests/ with its src)
            times[src].append(cpu_seconds(command, src, src.parent))
    base, new = (statistics.median(times[s]) for s in (args.base, args.new))
    for src, label in ((args.base, "base"), (args.new, "new")):
        print(f"{label} {src}: " + " ".join(f"{t:.1f}" for t in times[src]) + f"  median {statistics.median(times[src]):.1f} s")
    print(f"new / base: {new / base:.2f}x  ({base - new:+.1f} s CPU saved per run)")


if __name__ == "__main__":
    main()
