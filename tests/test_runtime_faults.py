"""Faults: a dead or silent rank makes the others fail fast, naming the rank and the action;
a non-finite loss stops the run before any weight changes (or skips the step when asked)."""

from __future__ import annotations

import multiprocessing
import time

import pytest

torch = pytest.importorskip("torch")

import pipesched  # noqa: E402
from pipesched.runtime.launch import DistributedRunError, spawn  # noqa: E402
from runtime_cases import faulty_run, nonfinite_run  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.mark.timeout(60)
def test_a_killed_rank_makes_the_others_fail_fast():
    schedule = pipesched.build_schedule("1f1b", 2, 4)
    t0 = time.monotonic()
    with pytest.raises(DistributedRunError) as err:
        spawn(faulty_run, 2, (schedule, "kill", 30.0), timeout_s=30.0)
    message = str(err.value)
    assert "rank 1 died (killed by signal 9)" in message
    assert "rank 0 gave up waiting at" in message and "from rank 1" in message
    assert time.monotonic() - t0 < 25  # far below the 30 s timeout: a dead peer is noticed at once
    assert not multiprocessing.active_children()


@pytest.mark.timeout(60)
def test_a_silent_rank_times_out_and_is_stopped():
    schedule = pipesched.build_schedule("zb-v", 2, 4)
    t0 = time.monotonic()
    with pytest.raises(DistributedRunError) as err:
        spawn(faulty_run, 2, (schedule, "hang", 3.0), timeout_s=3.0)
    message = str(err.value)
    assert "rank 0 timed out after 3s waiting at" in message or "rank 0 gave up waiting at" in message
    assert "from rank 1" in message
    assert "rank 1 was stopped" in message
    assert time.monotonic() - t0 < 30
    assert not multiprocessing.active_children()


@pytest.mark.timeout(60)
def test_nonfinite_loss_names_step_and_microbatch_and_can_be_skipped():
    schedule = pipesched.build_schedule("zb-h1", 2, 4)
    with pytest.raises(DistributedRunError, match=r"step 0: the loss of microbatch 2 is (nan|inf)"):
        spawn(nonfinite_run, 2, (schedule, False), timeout_s=30.0)
    skipped, unchanged = spawn(nonfinite_run, 2, (schedule, True), timeout_s=30.0)[0]
    assert skipped and unchanged
