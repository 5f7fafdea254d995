"""torch's own runtime runs the program pipesched writes and trains as the unpipelined model does.

Each single-pipeline family's ``compute_comms`` CSV is loaded into torch.distributed.pipelining's
``_PipelineScheduleRuntime`` with ``format="compute_comms"`` (taken as written: torch lowers
nothing) and trained on gloo at 2 and 4 ranks; losses, first-step gradients and parameters after
the steps equal the unpipelined run's. One spawn of 4 ranks trains them all (the 2-rank
schedules on two pairs of ranks at once).

The same launch then runs four CSVs on FSDP2 stages at pp 2 x dp_shard 2 (issue 28 item 6, issue
29 item 3): 1f1b's and zb-v's with torch's window of 3, and two whose gathers
``plan_programs(..., plan="auto")`` placed from the costs (zb-v's, each gather issued as late as
it hides; interleaved 1f1b at 4 stages a rank under a limit of 2 gathered at once, so stages are
resharded and gathered again within the step): torch runs each as written and trains as the
unpipelined model does.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from runtime_cases import STEPS, assert_equal_to_reference, reference  # noqa: E402
from torch_runtime_cases import torch_runs_compute_comms  # noqa: E402

import pipesched  # noqa: E402
from pipesched.runtime.launching.launch import spawn  # noqa: E402
from pipesched.runtime.program.planned_gathers import GatherCosts, plan_programs  # noqa: E402
from pipesched.runtime.program.program import lower_all  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]
SINGLE_PIPELINE = [f.name for f in pipesched.families() if f.parameter_copies == 1]
SIZE = dict(blocks=7, dim=8, hidden=16)  # 8 blocks: one per stage at 4 ranks x 2 chunks
MICROBATCHES, BATCH = 8, 16


def _sharded_runs() -> list:
    """(label, schedule, programs or None: the default lowering) for the FSDP2 runs."""
    zbv = pipesched.build_schedule("zb-v", 2, MICROBATCHES)
    interleaved = pipesched.build_schedule("interleaved-1f1b", 2, MICROBATCHES, 4)
    ones = {s: 1.0 for s in range(8)}
    late = plan_programs(zbv, GatherCosts({s: 0.5 for s in range(4)}), plan="auto")
    tight = plan_programs(interleaved, GatherCosts({s: 2.0 for s in range(8)}, ones, limit=2), plan="auto")
    assert late.placement == "auto" and [p.cells() for p in late.programs] != [p.cells() for p in lower_all(zbv)]
    assert tight.placement == "window 2" and max(tight.peak_bytes) == 2
    return [("fsdp 1f1b", pipesched.build_schedule("1f1b", 2, MICROBATCHES), None), ("fsdp zb-v", zbv, None),
            ("fsdp zb-v planned", zbv, late.programs), ("fsdp interleaved-1f1b planned", interleaved, tight.programs)]


@pytest.mark.timeout(300)
def test_torch_trains_every_single_pipeline_family_from_our_program_as_unpipelined():
    runs = [(f"{name} p={p}", pipesched.build_schedule(name, p, MICROBATCHES)) for p in (4, 2) for name in SINGLE_PIPELINE]
    assert {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "interleaved-zb", "dualpipev"} <= set(SINGLE_PIPELINE)
    sharded = _sharded_runs()
    results = spawn(torch_runs_compute_comms, 4, ("mlp", SIZE, BATCH, runs, sharded), timeout_s=270)[0]
    assert set(results) == {label for label, _ in runs} | {label for label, _, _ in sharded}
    for label, schedule in runs:  # torch ran the file as written
        assert results[label]["program"] == [p.cells() for p in lower_all(schedule)], label
    for label, schedule, programs in sharded:
        assert results[label]["program"] == [p.cells() for p in (programs or lower_all(schedule))], label
    assert all(len(result["losses"]) == STEPS for result in results.values())
    assert_equal_to_reference(results, reference("mlp", SIZE, BATCH))
