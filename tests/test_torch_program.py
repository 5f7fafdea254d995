"""torch's own runtime runs the program pipesched writes and trains as the unpipelined model does.

Each single-pipeline family's ``compute_comms`` CSV is loaded into torch.distributed.pipelining's
``_PipelineScheduleRuntime`` with ``format="compute_comms"`` (taken as written: torch lowers
nothing) and trained on gloo at 2 and 4 ranks; losses, first-step gradients and parameters after
the steps equal the unpipelined run's. One spawn of 4 ranks trains them all (the 2-rank
schedules on two pairs of ranks at once).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from runtime_cases import STEPS, assert_equal_to_reference, reference  # noqa: E402
from torch_runtime_cases import torch_runs_compute_comms  # noqa: E402

import pipesched  # noqa: E402
from pipesched.runtime.launching.launch import spawn  # noqa: E402
from pipesched.runtime.program.program import lower_all  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]
SINGLE_PIPELINE = [f.name for f in pipesched.families() if f.parameter_copies == 1]
SIZE = dict(blocks=7, dim=8, hidden=16)  # 8 blocks: one per stage at 4 ranks x 2 chunks
MICROBATCHES, BATCH = 8, 16


@pytest.mark.timeout(150)
def test_torch_trains_every_single_pipeline_family_from_our_program_as_unpipelined():
    runs = [(f"{name} p={p}", pipesched.build_schedule(name, p, MICROBATCHES)) for p in (4, 2) for name in SINGLE_PIPELINE]
    assert {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "interleaved-zb", "dualpipev"} <= set(SINGLE_PIPELINE)
    results = spawn(torch_runs_compute_comms, 4, ("mlp", SIZE, BATCH, runs), timeout_s=120)[0]
    assert set(results) == {label for label, _ in runs}
    for label, schedule in runs:  # torch ran the file as written
        assert results[label]["program"] == [p.cells() for p in lower_all(schedule)], label
        assert len(results[label]["losses"]) == STEPS
    assert_equal_to_reference(results, reference("mlp", SIZE, BATCH))
