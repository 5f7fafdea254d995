"""Launch variables that name no group (issue 31), through the console script: a stale full set
of torchrun's variables with no peer, a ``MASTER_PORT`` where another program (a plain socket)
listens, one that another program holds. Each ends in one line naming the address, exit 1,
within ``--timeout`` of the join (before: a silent hang, or 65 lines of traceback).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from conftest import cli_env, concurrently

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.timeout(200)]

TIMEOUT_S = 3
STARTUP_S = 150  # importing torch and checking the options: about 5 s, a minute seen on a loaded 2-core machine
TRAIN = ["train", "--ranks", "2", "--steps", "1", "--batch-size", "8", "--timeout", str(TIMEOUT_S)]


def _as_rank(rank: int, port: int) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(cli_env(), RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pipesched", *TRAIN], capture_output=True, text=True, env=env,
                          timeout=STARTUP_S + 30)
    return done, time.monotonic() - start


def test_a_group_that_cannot_form_is_one_line_naming_the_address_within_the_timeout():
    with socket.socket() as listening, socket.socket() as free:
        listening.bind(("127.0.0.1", 0))
        listening.listen()  # a plain socket: it accepts, and never answers as a store would
        free.bind(("127.0.0.1", 0))
        taken, unused = listening.getsockname()[1], free.getsockname()[1]
        free.close()  # nothing listens there now: rank 0 hosts the store, and no peer comes
        rows = [(1, taken), (0, taken), (0, unused)]
        (answered, _), (in_use, _), (alone, _) = results = concurrently(lambda row: _as_rank(*row), rows, workers=3)
    for (done, seconds), (rank, port) in zip(results, rows):
        assert done.returncode == 1 and not done.stdout.strip(), (rank, port, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0], (rank, port, done.stderr)
        assert seconds < STARTUP_S + TIMEOUT_S, (rank, port, seconds)
    assert answered.stderr.startswith(f"pipesched: error: rank 1 of 2: the group did not form at 127.0.0.1:{taken} "
                                      f"within --timeout {TIMEOUT_S}s")
    assert in_use.stderr.startswith(f"pipesched: error: rank 0: cannot host the group's store at 127.0.0.1:{taken}: "
                                    "the port is in use by another program")
    assert alone.stderr.startswith("pipesched: error: rank 0")
