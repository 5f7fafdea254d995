"""Under torchrun, ``pipesched train`` joins torchrun's group instead of spawning its own ranks."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import cli_env, concurrently, run_cli

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(480)]

ARGS = ["train", "--model", "mlp", "--ranks", "2", "--steps", "2", "--batch-size", "16"]


def losses(text: str) -> str:
    match = re.search(r"loss of step \d+ (\S+) -> of step \d+ (\S+)", text)
    assert match, text
    return match.group(0)


# zb-auto with given costs: the same plan under both launchers (the built-in one would otherwise
# profile and plan with measured costs, which torchrun's ranks do not); a planned schedule of
# split backwards runs every kind of action a named one does (the Python API under torchrun:
# the Hugging Face docs example, tests/test_hf_cli.py)
def test_torchrun_trains_like_the_built_in_launcher():
    schedule = ["zb-auto", "--costs", "1,1.4,0.6"]

    def under_torchrun() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
             "-m", "pipesched", *ARGS, "--schedule", *schedule],
            capture_output=True, text=True, timeout=400, env=cli_env(),
        )

    def built_in() -> subprocess.CompletedProcess:
        return run_cli(*ARGS, "--schedule", *schedule, timeout=400)

    # two independent runs (each its own free port): side by side, each fills the other's idle core
    launched, spawned = concurrently(lambda run: run(), [under_torchrun, built_in], workers=2)
    assert launched.returncode == 0, launched.stderr[-2000:]
    assert spawned.returncode == 0, spawned.stderr[-2000:]
    assert losses(launched.stdout) == losses(spawned.stdout)
