"""Bounded planning work: CPU time and peak memory of the largest planning commands.

Each command runs as its own process (the installed ``pipesched`` console script) with a cap on
CPU seconds and address space, so that a command that would run for minutes is stopped and
reported as "stopped at the cap" with the memory it had reached. CPU seconds (user + system) are
the figure to compare: on a shared machine the wall time mostly measures the other processes.

    python benchmarks/bounded_planning.py                  # this checkout (src/)
    python benchmarks/bounded_planning.py --src OTHER/src  # another checkout, e.g. before a change
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).with_name("pipesched")

REFUSED = [  # far beyond the budget: refused at once (before the change: minutes and gigabytes)
    "simulate zb-auto -p 256 -m 4096 --json",
    "advise -p 256 -m 4096 --json",
    "compare -p 256 -m 4096 --json",
]
AT_THE_LIMIT = [  # the largest sizes accepted: what the suggestion in each refusal leads to
    "simulate zb-auto -p 256 -m 44 --json",
    "advise -p 256 -m 10 --json",
    "compare -p 256 -m 18 --json",
    "simulate 1f1b -p 256 -m 4096 --json",
    "simulate interleaved-zb -p 256 -m 179 --json",
    "simulate v-min -p 256 -m 130 --json",
]


def measure(command: str, src: Path, cpu_cap: int, memory_cap_gb: float) -> dict:
    """Run ``pipesched COMMAND`` under the caps; CPU seconds, wall seconds, peak RSS, outcome."""
    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_cap, cpu_cap + 5))
        cap = int(memory_cap_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = dict(os.environ, PYTHONPATH=str(src))
    started = time.perf_counter()
    proc = subprocess.Popen(
        [str(SCRIPT), *command.split()], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=env, preexec_fn=limits,
    )
    stderr = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        outcome = f"stopped at the {cpu_cap} s CPU cap"
    elif proc.returncode == 2:
        outcome = "refused: " + stderr.strip().splitlines()[-1][len("pipesched: error: "):][:90] + "..."
    elif proc.returncode == 0:
        outcome = "finished"
    else:
        outcome = f"exit {proc.returncode}: {stderr.strip().splitlines()[-1][:90] if stderr.strip() else ''}"
    return {
        "command": command, "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall,
        "peak_rss_mb": usage.ru_maxrss / 1024, "outcome": outcome,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="The pipesched source to run.")
    parser.add_argument("--cpu-cap", type=int, default=120, help="CPU seconds before a command is stopped.")
    parser.add_argument("--memory-cap-gb", type=float, default=8.0, help="Address space per command.")
    parser.add_argument("--only", choices=("refused", "limit"), help="Run one of the two lists.")
    args = parser.parse_args()
    commands = {"refused": REFUSED, "limit": AT_THE_LIMIT, None: REFUSED + AT_THE_LIMIT}[args.only]
    print(f"source {args.src}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| command | CPU s | wall s | peak RSS MB | outcome |\n|---|---|---|---|---|")
    for command in commands:
        r = measure(command, args.src, args.cpu_cap, args.memory_cap_gb)
        print(f"| `pipesched {r['command']}` | {r['cpu_s']:.1f} | {r['wall_s']:.1f} | {r['peak_rss_mb']:.0f} | {r['outcome']} |", flush=True)


if __name__ == "__main__":
    main()
