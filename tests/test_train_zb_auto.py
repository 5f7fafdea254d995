"""``pipesched train -s zb-auto`` plans with the model's measured costs, from one profile
(and ``-s auto`` profiles as the run computes).

In process, without ranks: the profile is replaced by a fixed measurement and the run by one
that keeps the plan it was given, so what the planner received, how often the profile ran and
what stderr said are checked exactly. The real profile and run are covered end to end by
tests/test_runtime_memory.py (a byte limit: the profile serves the sizes and the costs).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from pipesched import build_schedule, simulate  # noqa: E402
from pipesched.cli import main  # noqa: E402
from pipesched.costs import UNIT, Costs  # noqa: E402
from pipesched.memory import StageMemory  # noqa: E402
from pipesched.training.profile import Profile  # noqa: E402
from pipesched.zb_auto_plan import ZbAutoInputs  # noqa: E402

pytestmark = pytest.mark.torch
MS = 1e-3
MEASURED = Profile(  # stage 0 forward-heavy, stage 1 (the head) input-gradient-heavy, as the mlp measures
    model="mlp", ranks=2, microbatches=4, batch_size=16, num_blocks=9,
    stage_costs=((5.4 * MS, 2.3 * MS, 2.9 * MS), (1.6 * MS, 4.5 * MS, 1.3 * MS)), comm=0.6 * MS,
    stage_memory=((StageMemory(keep=176_000, stash=150_000), 16_000), (StageMemory(keep=120_000, stash=100_000), 16_000)),
    step_time=60 * MS, stage_blocks=(5, 4),
)
ARGS = ["train", "--model", "mlp", "--ranks", "2", "--microbatches", "4", "--batch-size", "16"]


@pytest.fixture
def planned(monkeypatch):
    """Run ``pipesched ARGS -s SCHEDULE ...`` in process; returns (profile calls, the costs of each zb-auto
    planned, the plan the run got, stderr)."""
    import pipesched.training.profile as profile_module
    import pipesched.training.train as runtime_train
    import pipesched.zb_auto_plan as zb_auto_plan

    profiles, planner, runs = [], [], []

    def profile(*args, **kwargs):
        profiles.append((args, kwargs))
        return MEASURED

    def build_schedule(name, ranks, microbatches, chunks=None, costs=None, **kwargs):
        planner.append(costs)
        return real_build(name, ranks, microbatches, chunks, costs, **kwargs)

    real_build = zb_auto_plan.build_schedule
    monkeypatch.setattr(profile_module, "profile", profile)
    monkeypatch.setattr(zb_auto_plan, "build_schedule", build_schedule)
    monkeypatch.setattr(runtime_train, "run", lambda cfg: runs.append(cfg))  # None: as a torchrun rank other than 0

    def invoke(capsys, *extra: str, schedule: str = "zb-auto"):
        for seen in (profiles, planner, runs):
            seen.clear()
        with pytest.raises(SystemExit) as done:
            main([*ARGS, "-s", schedule, *extra])
        err = capsys.readouterr().err
        assert done.value.code == 0, err
        assert len(runs) == 1
        return profiles, planner, runs[0].schedule, err

    return invoke


def test_zb_auto_plans_with_the_profiles_measured_costs_and_says_so(planned, capsys):
    profiles, planner, plan, err = planned(capsys)
    assert len(profiles) == 1
    args, kwargs = profiles[0]
    assert args == ("mlp", 2, 4, 16) and kwargs["dtype"] == "fp32"  # the run's model, ranks, microbatches, batch
    assert kwargs["timeout_s"] == 300
    assert planner == [MEASURED.costs(), UNIT]  # the unit-cost plan too, kept if the measured costs rank it first
    assert MEASURED.costs().stage_multipliers == pytest.approx((10.6 / 9, 7.4 / 9))  # F+I+W over the mean
    assert plan.name == "zb-auto"
    assert ("zb-auto: planned with measured costs F 3.5 ms, I 3.4 ms, W 2.1 ms, comm 0.6 ms, stage overhead 0 ms, "
            "stage factors 1.18, 0.82 (profile of 4 steps") in err


def test_the_profile_runs_in_the_runs_dtype_with_its_timeout(planned, capsys):
    profiles, _, _, _ = planned(capsys, "--dtype", "bf16", "--timeout", "42")
    assert profiles[0][1]["dtype"] == "bf16" and profiles[0][1]["timeout_s"] == 42


def test_one_profile_serves_both_a_byte_limit_and_the_costs(planned, capsys):
    profiles, planner, plan, err = planned(capsys, "--memory-limit", "400KB", "--dp", "1")
    assert len(profiles) == 1
    assert planner == [MEASURED.costs(), UNIT]
    assert plan.meta["memory_limit"] == pytest.approx(400_000 / 176_000)  # the fullest stage's bytes are one M_B
    assert "memory limit 2.273 M_B" in err and "planned with measured costs" in err


def test_given_costs_plan_without_a_profile(planned, capsys):
    profiles, planner, _, err = planned(capsys, "--costs", "1,1,1")
    assert profiles == [] and planner == [UNIT]
    assert "zb-auto: planned with --costs F 1, I 1, W 1, comm 0" in err
    profiles, planner, _, err = planned(capsys, "--costs", "1,1.4,0.6", "--comm", "0.1")
    assert profiles == [] and planner == [Costs(1, 1.4, 0.6, comm=0.1)]


def test_under_torchrun_no_profile_runs_and_the_plan_says_unit_costs(planned, capsys, monkeypatch):
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)
    profiles, planner, _, err = planned(capsys)
    assert profiles == [] and planner == [UNIT]
    assert "planned with unit costs (F = I = W = 1, comm 0): under torchrun no profile runs" in err


def test_a_model_with_too_few_blocks_for_a_v_is_planned_with_one_chunk_per_rank(planned, capsys):
    # the 6-block GPT has no 8-stage V on 4 ranks: zb-auto searches the loop placement only
    _, _, plan, _ = planned(capsys, "--model", "gpt", "--ranks", "4", "--costs", "1,1.4,0.6")
    assert plan.chunks == 1 and plan.stages == 4


def test_the_measured_plan_is_never_slower_under_the_measured_costs_than_the_unit_cost_plan(capsys):
    # the mlp's costs measured on 4 ranks: at a limit of 1 M_B zb-auto's search, led by these
    # costs, ends on a 1-chunk order that they time 1.2x slower than the V order it finds for unit costs
    # (a search that finds the V order itself would make the fallback moot: this test then says so)
    measured = Costs(4.42, 4.27, 1.55, comm=0.22, stage_multipliers=(0.88, 1.01, 1.06, 1.05))
    inputs = ZbAutoInputs(measured, measured=True, memory_limit=1.0, recompute_input=None)
    kept = inputs.plan(4, 8, None)
    searched = build_schedule("zb-auto", 4, 8, costs=measured, memory_limit=1.0)
    unit = build_schedule("zb-auto", 4, 8, costs=UNIT, memory_limit=1.0)
    times = {label: simulate(s, measured).makespan for label, s in (("kept", kept), ("searched", searched), ("unit", unit))}
    assert times["unit"] < times["searched"] and times["kept"] == times["unit"]
    assert "zb-auto: the plan for unit costs is faster under the measured costs" in capsys.readouterr().err
    given = ZbAutoInputs(measured, measured=False, memory_limit=1.0, recompute_input=None)
    assert simulate(given.plan(4, 8, None), measured).makespan == times["searched"]  # given costs: as simulate plans


def test_auto_profiles_and_advises_in_the_runs_dtype_with_its_timeout(planned, capsys):
    """``-s auto`` measures what the run will compute: bf16 profiled in bf16 (half the activation
    bytes the advisor and a byte limit see), with the run's --timeout."""
    profiles, _, plan, err = planned(capsys, "--dtype", "bf16", "--timeout", "42", schedule="auto")
    assert len(profiles) == 1 and profiles[0][0] == ("mlp", 2, 4, 16)
    assert profiles[0][1]["dtype"] == "bf16" and profiles[0][1]["timeout_s"] == 42
    assert "auto: " in err and plan is not None
