"""Local ranks: one compute thread each, freed memory kept (glibc); a rank off the CPU over gloo
sends its messages through host memory."""

from __future__ import annotations

import platform

import pytest

pytest.importorskip("torch")

from runtime_cases import rank_setup  # noqa: E402

from pipesched.runtime.launching.launch import spawn  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.timeout(120)
def test_spawned_ranks_use_one_thread_and_keep_freed_memory():
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    results = spawn(rank_setup, 2, None, timeout_s=60)
    assert results == {0: (1, glibc), 1: (1, glibc)}


@pytest.mark.timeout(120)
def test_ranks_computing_off_the_cpu_stage_messages_through_host_memory_over_gloo():
    from runtime_cases import staging_decision

    assert spawn(staging_decision, 3, None, timeout_s=60) == {0: True, 1: True, 2: True}
