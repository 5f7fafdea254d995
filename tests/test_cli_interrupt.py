"""Ctrl-C on a planning command, through the installed console script: one line
``pipesched: interrupted`` on stderr, exit status 130, no traceback.

Each command below plans for many CPU seconds. The terminal's Ctrl-C (SIGINT to the command's
whole process group) is sent once the group has used more CPU time than starting Python and
loading the commands take, so that it lands in the planning itself, whatever the machine's load.
The group's time counts the advisor's search workers, which do its planning on a machine with
more than one core.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import as_from_a_terminal, cli_env, concurrently

SCRIPT = Path(sys.executable).with_name("pipesched")
STARTED_CPU_S = 1.5  # more than the start-up's CPU time (about 0.6 s), far less than the planning's
LONG_PLANNING = [  # each 6-9 CPU s on the project's machine, four or more times the trigger
    ["simulate", "v-min", "-p", "64", "-m", "256"],
    ["compare", "-p", "64", "-m", "128"],
    ["advise", "-p", "32", "-m", "224"],  # in 2 worker processes
    ["simulate", "zb-auto", "-p", "64", "-m", "256"],
]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads CPU time from /proc")


def _group_cpu_seconds(group: int) -> float:
    """CPU seconds used so far by the live processes of process group ``group``."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[2]) == group:  # pgrp
            ticks += int(fields[11]) + int(fields[12])  # utime + stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _interrupted(argv: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """Start ``pipesched ARGV``, press Ctrl-C once it plans; the result and the seconds it took to stop."""
    proc = subprocess.Popen(as_from_a_terminal([str(SCRIPT), *argv]), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(), start_new_session=True)
    while proc.poll() is None and _group_cpu_seconds(proc.pid) < STARTED_CPU_S:
        time.sleep(0.05)
    pressed = time.monotonic()
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - pressed


@pytest.mark.timeout(300)
def test_ctrl_c_stops_a_planning_command_in_one_line_and_exit_130():
    for argv, (result, stopped_within) in zip(LONG_PLANNING, concurrently(_interrupted, LONG_PLANNING)):
        said = f"pipesched {' '.join(argv)}: {result.stderr[-600:]!r}"
        assert result.returncode == 130, said
        assert result.stderr.strip().splitlines() == ["pipesched: interrupted"], said
        assert stopped_within < 60, said  # at once, not after the planning's remaining minutes
