"""A run its ranks refuse as bad input (one of pipesched's own errors, raised on the ranks: e.g.
tensor parallelism's guard against partial gradients, tp_guard.py) ends ``pipesched train`` as
bad input refused before the ranks start does: one line, exit 2, no traceback. A failure of a
rank's own beside it (a death) is a failed run: exit 1.

In process: the launch is replaced by the launcher's own watch (``rank_watch.collect``) fed what
the ranks report (``launch.failure_report`` of the error each raised), so the classification,
the launcher's verdict and the CLI's exit are the real ones; the guard raising on every rank is
tests/test_sharded_pipelines.py's (through the runtime) and tests/test_sharded_stages.py's.
"""

from __future__ import annotations

import queue

import pytest

pytest.importorskip("torch")

from pipesched.cli import main  # noqa: E402

pytestmark = pytest.mark.torch
TRAIN = ["train", "--model", "gpt", "--ranks", "2", "--tp", "2", "-s", "1f1b", "--steps", "1"]


class Exited:
    """A rank process that has exited (the watch reads its exit code; it never signals it)."""

    exitcode, pid = 1, -1


@pytest.mark.parametrize("second, code", [("refused", 2), ("died", 1)])
def test_bad_input_every_rank_refuses_is_one_line_and_exit_2_a_death_beside_it_exit_1(monkeypatch, capsys, second, code):
    import pipesched.runtime.launching.launch as launch
    from pipesched.runtime.launching.rank_watch import collect
    from pipesched.runtime.sharding.tp_guard import PartialGradients, refusal

    line = refusal(["1.attn.norm.weight", "2.attn.norm.weight"], 2)

    def spawn(worker, world, payload, timeout_s):
        assert world == 4  # 2 pipeline ranks x tp 2
        reports = queue.Queue()
        for rank in range(world):
            if rank != 3 or second == "refused":  # else rank 3 died without a word
                kind, text = launch.failure_report(PartialGradients(line))
                reports.put((kind, rank, text))
        return collect([Exited() for _ in range(world)], reports, timeout_s)

    monkeypatch.setattr(launch, "spawn", spawn)
    with pytest.raises(SystemExit) as done:
        main(TRAIN)
    err = capsys.readouterr().err
    assert done.value.code == code, err
    said = "ranks 0, 1, 2, 3" if code == 2 else "rank 3 died (exit status 1); ranks 0, 1, 2"
    assert err.strip().splitlines() == [f"pipesched: error: {said}: {line}"]
