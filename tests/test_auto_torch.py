"""The automatic schedules load into torch's runtime and beat torch's own under skewed costs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipesched import Costs, build_schedule, simulate  # noqa: E402
from pipesched.interop.torch_schedules import torch_schedule  # noqa: E402
from test_vs_torch import _mock_runtime  # noqa: E402

pytestmark = pytest.mark.torch
SKEWED = Costs(F=1, B=1.4, W=0.6, comm=0.1)


@pytest.mark.parametrize("name", ["zb-auto", "v-half", "v-min"])
def test_csv_loads_into_torch_runtime(tmp_path, name):
    schedule = build_schedule(name, ranks=4, microbatches=8, costs=SKEWED)
    path = tmp_path / f"{name}.csv"
    path.write_text(schedule.to_csv(), newline="")
    runtime = _mock_runtime(4, schedule.chunks, 8)
    runtime._load_csv(str(path), format="compute_only")
    loaded = {r: [str(a) for a in runtime.pipeline_order[r] if a is not None] for r in range(4)}
    assert loaded == {r: [str(a) for a in schedule.rank_actions(r)] for r in range(4)}


@pytest.mark.parametrize("p, m", [(4, 8), (8, 16)])
@pytest.mark.parametrize("heavy_ends", [False, True])
def test_zb_auto_is_strictly_faster_than_torchs_best_that_fits(p, m, heavy_ends):
    mults = (1.3,) + (1.0,) * (p - 2) + (1.3,) if heavy_ends else None
    costs = Costs(F=1, B=1.4, W=0.6, comm=0.1, stage_multipliers=mults)
    ours = simulate(build_schedule("zb-auto", p, m, costs=costs), costs)
    theirs = []
    for name in ("interleaved-1f1b", "interleaved-zb", "zb-v", "dualpipev"):
        schedule = torch_schedule(name, p, m, 2)
        if schedule is not None:
            result = simulate(schedule, costs)
            if result.max_peak_memory <= p:
                theirs.append(result.makespan)
    assert theirs and ours.makespan < min(theirs) - 1e-6
