"""How local ranks start (``runtime/launching/rank_start.py``): forked from the launcher on Linux,
so that a rank starts with what the launcher imported and checked (the family's twin check
runs once, in the launcher); spawned when asked (the fallback where fork is unsafe), each
rank then importing and checking for itself; either way SIGTERM ends a rank (the launcher's
handler is not inherited) and each computes on one thread. Ranks that outnumber the cores
get one line of warning, through the console script.

Cost: two launches of two trivial ranks (fork: a fraction of a second; spawn: two imports of
torch) and one two-rank ``train`` of the mlp for one step on one core."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("torch")
import torch  # noqa: E402

from conftest import cli_env  # noqa: E402

from pipesched.errors import ConfigError  # noqa: E402
from pipesched.runtime.launching import rank_start  # noqa: E402
from pipesched.runtime.launching.launch import spawn  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]
LINUX = sys.platform.startswith("linux")


def rank_state(rank: int, world: int, _payload) -> tuple:
    """What a rank starts with: its start method's marks (the launcher's modules, the twin
    checks it passed), its SIGTERM handler, its compute threads."""
    from pipesched.hf import twin

    return ("transformers" in sys.modules, len(twin._PASSED), signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
            torch.get_num_threads())


@pytest.mark.skipif(not LINUX, reason="ranks fork on Linux only")
def test_forked_ranks_start_with_the_launchers_checks_and_spawned_ones_without(monkeypatch):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig

    from pipesched.hf.build import BlockSource

    BlockSource(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2))  # the launcher's twin check
    monkeypatch.delenv("PIPESCHED_RANK_START", raising=False)
    assert rank_start.start_method() == "fork"
    forked = spawn(rank_state, 2, None, timeout_s=60)
    monkeypatch.setenv("PIPESCHED_RANK_START", "spawn")
    spawned = spawn(rank_state, 2, None, timeout_s=60)
    # the forked ranks hold the launcher's transformers and its passed twin checks (this one and
    # any an earlier test passed in this process); the spawned ones imported neither (the twin
    # check would run in each, as it does under torchrun)
    from pipesched.hf import twin

    assert twin._PASSED
    assert [state[:2] for state in forked.values()] == [(True, len(twin._PASSED))] * 2
    assert [state[:2] for state in spawned.values()] == [(False, 0), (False, 0)]
    for state in (*forked.values(), *spawned.values()):
        assert state[2:] == (True, 1)  # SIGTERM ends it; one compute thread


def test_a_start_method_other_than_fork_or_spawn_is_refused(monkeypatch):
    monkeypatch.setenv("PIPESCHED_RANK_START", "forkserver")
    with pytest.raises(ConfigError, match="PIPESCHED_RANK_START='forkserver': use one of fork, spawn"):
        rank_start.start_method()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_ranks_outnumbering_the_cores_are_warned_once_in_one_line():
    core = min(os.sched_getaffinity(0))
    done = subprocess.run(
        [sys.executable, "-m", "pipesched", "train", "--model", "mlp", "--ranks", "2", "--steps", "1", "--batch-size", "8"],
        capture_output=True, text=True, timeout=170, env=cli_env(), preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "ranks on" in line]
    assert warned == ["pipesched: 2 ranks on 1 core: steps run slower, as the ranks take turns on the cores "
                      "(step times and the measured bubble include the waiting)"]
    assert "Traceback" not in done.stderr
