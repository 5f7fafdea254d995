"""Local ranks: one compute thread each, freed memory kept (glibc), each run its own store (two
runs side by side never meet); a rank off the CPU over gloo sends its messages through host memory."""

from __future__ import annotations

import platform

import pytest

pytest.importorskip("torch")

from conftest import concurrently  # noqa: E402
from runtime_cases import rank_setup  # noqa: E402

from pipesched.runtime.launching.launch import spawn  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.timeout(120)
def test_spawned_ranks_use_one_thread_keep_freed_memory_and_join_their_own_runs_store():
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    # two runs at once, as the suite's workers and users' side-by-side runs start them; their
    # ranks stop right after joining, which failed a peer's join in 7 of 216 runs before every group
    # waited for all its ranks to join (benchmarks/join_race.py runs it hundreds of times)
    runs = concurrently(lambda _: spawn(rank_setup, 2, None, timeout_s=60), range(2), workers=2)
    for results in runs:
        assert [(threads, kept) for threads, kept, _ in results.values()] == [(1, glibc), (1, glibc)]
        assert len({port for _, _, port in results.values()}) == 1  # one store per run


@pytest.mark.timeout(120)
def test_ranks_computing_off_the_cpu_stage_messages_through_host_memory_over_gloo():
    from runtime_cases import staging_decision

    assert spawn(staging_decision, 3, None, timeout_s=60) == {0: True, 1: True, 2: True}
