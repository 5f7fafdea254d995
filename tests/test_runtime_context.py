"""The batch context: per-microbatch tensors (masks, positions) every stage reads, never sent.

A block whose ``forward`` takes a ``context`` argument is given microbatch ``k``'s slice of the
step's context by every action of ``k`` that runs it (forward, recomputation inside a backward);
no global holds it. The sequence length changes from step to step (5, 7, 5):
every rank re-infers its boundary shapes from the context and inputs it is given and resizes its
receive buffers. The loss, every gradient and the parameters after three steps equal the
unpipelined model run with the whole batch's context.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from runtime_cases import (  # noqa: E402
    assert_equal_to_reference,
    context_run,
    train_context_reference,
)

import pipesched  # noqa: E402
from pipesched.runtime.launching.launch import spawn  # noqa: E402
from pipesched.runtime.stages import batch_context

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.mark.timeout(150)
def test_every_stage_reads_its_microbatchs_context_and_the_sequence_length_may_change():
    runs = [(n, pipesched.build_schedule(n, 2, 4), None) for n in ("1f1b", "zb-v", "interleaved-zb", "dualpipe")]
    runs.append(("zb-h1 recomputed", pipesched.build_schedule("zb-h1", 2, 4), "all"))
    results = spawn(context_run, 2, (runs, 8), timeout_s=60)[0]
    assert_equal_to_reference(results, train_context_reference(8))


def test_the_context_splits_like_the_inputs_and_reaches_only_blocks_that_take_it():
    from pipesched.runtime.stages.partition import Stage

    parts = batch_context.split({"mask": torch.arange(8).reshape(4, 2)}, 2, torch.device("cpu"))
    assert [p["mask"].tolist() for p in parts] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]

    class Reads(torch.nn.Module):
        def forward(self, x, context):
            return x + context["mask"].sum()

    stage = Stage(0, {0: torch.nn.Identity(), 1: Reads()})  # Identity takes no context
    assert [takes for _, takes in stage.chain] == [False, True]
    assert stage(torch.zeros(1), parts[1]).item() == 4 + 5 + 6 + 7
    with pytest.raises(pipesched.ConfigError, match="does not split into 3"):
        batch_context.split({"mask": torch.zeros(4, 2)}, 3, torch.device("cpu"))
