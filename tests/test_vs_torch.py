"""Against torch.distributed.pipelining's own generators (mocked stages, no process group).

On every p in {2, 4, 8} and m in 1..32 that torch accepts, ours reach a makespan no larger than
torch's counterpart at no more peak memory (unit costs); and schedules cross in both directions
through torch's CSV reader and writer.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import pipesched  # noqa: E402
from pipesched import Costs, Schedule, build_schedule, get_family, simulate  # noqa: E402
from pipesched.actions import Overlap  # noqa: E402
from pipesched.interop.torch_schedules import torch_schedule  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("name", ["interleaved-1f1b", "looped-bfs", "interleaved-zb", "zb-v"])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_ours_are_never_slower_nor_hungrier_than_torch(name, p):
    compared = 0
    for m in range(1, 33):
        theirs = torch_schedule(name, p, m)
        if theirs is None:
            continue
        reference = simulate(theirs)
        # families that trade memory for speed are asked to stay within torch's memory
        limit = reference.max_peak_memory if get_family(name).uses_memory_limit else None
        ours = simulate(build_schedule(name, ranks=p, microbatches=m, memory_limit=limit))
        assert ours.makespan <= reference.makespan + 1e-9, (m, ours.makespan, reference.makespan)
        assert ours.max_peak_memory <= reference.max_peak_memory + 1e-9, m
        compared += 1
    assert compared > 0


@pytest.mark.parametrize("p, m", [(2, 3), (4, 5), (4, 7), (8, 9), (8, 15)])
def test_interleaved_zb_at_torchs_peak_is_never_slower_under_skewed_costs(p, m):
    costs = Costs(F=1, B=1.4, W=0.6, comm=0.1)
    reference = simulate(torch_schedule("interleaved-zb", p, m), costs)
    ours = simulate(build_schedule("interleaved-zb", p, m, costs=costs, memory_limit=reference.max_peak_memory), costs)
    assert ours.makespan <= reference.makespan + 1e-9
    assert ours.max_peak_memory <= reference.max_peak_memory + 1e-9


@pytest.mark.parametrize("p, m", [(4, 5), (8, 9)])
def test_interleaved_zb_keeps_1f1b_memory_by_default_and_matches_torch_given_its_peak(p, m):
    """Where torch's holds half a microbatch more than p (the README's example), ours stays at
    p by default, and reaches torch's makespan when given torch's peak as its limit."""
    reference = simulate(torch_schedule("interleaved-zb", p, m))
    assert reference.max_peak_memory > p
    assert simulate(build_schedule("interleaved-zb", p, m)).max_peak_memory <= p
    matched = simulate(build_schedule("interleaved-zb", p, m, memory_limit=reference.max_peak_memory))
    assert matched.makespan <= reference.makespan


def test_torch_refuses_counts_we_schedule():
    assert torch_schedule("1f1b", 4, 2) is None  # torch: n_microbatches >= num_stages
    simulate(build_schedule("1f1b", ranks=4, microbatches=2))
    refused = [m for m in range(1, 33) if torch_schedule("interleaved-1f1b", 4, m) is None]
    assert 9 in refused  # torch: m must be a multiple of max(1, m // p) rounds
    for m in refused:
        result = simulate(build_schedule("interleaved-1f1b", ranks=4, microbatches=m))
        assert result.makespan <= 3 * (m + 4 - 1)


def _mock_runtime(ranks: int, stages_per_rank: int, microbatches: int):
    from unittest import mock

    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    from torch.distributed.pipelining.stage import PipelineStage

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank = 0
    stage.group_size = ranks
    stage.submod = None
    stage.num_stages = ranks * stages_per_rank
    return _PipelineScheduleRuntime([stage] * stages_per_rank, microbatches)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-v", "interleaved-1f1b", "interleaved-zb", "dualpipev"])
def test_our_csv_loads_into_torch_runtime(tmp_path, name):
    schedule = build_schedule(name, ranks=4, microbatches=8)
    path = tmp_path / f"{name}.csv"
    path.write_text(schedule.to_csv(), newline="")
    runtime = _mock_runtime(4, schedule.chunks, 8)
    runtime._load_csv(str(path), format="compute_only")  # validates and lowers with comms
    loaded = {r: [str(a) for a in runtime.pipeline_order[r] if a is not None] for r in range(4)}
    assert loaded == {r: [str(a) for a in schedule.rank_entries(r)] for r in range(4)}


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_our_dualpipev_is_torchs_action_for_action(p):
    for m in range(2 * p, 2 * p + 4):
        assert build_schedule("dualpipev", p, m).to_csv() == torch_schedule("dualpipev", p, m).to_csv(), m


@pytest.mark.parametrize("name", ["interleaved-1f1b", "interleaved-zb", "zb-v", "dualpipev"])
def test_csv_written_by_torch_loads_into_ours_and_round_trips(tmp_path, name):
    runtime = _mock_runtime(4, 2, 8)
    theirs = torch_schedule(name, 4, 8)
    runtime.pipeline_order = {
        r: [None if a is None else _to_torch(a) for a in theirs.orders[r]] for r in range(4)
    }
    path = tmp_path / "torch.csv"
    runtime._dump_csv(str(path), format="compute_only")
    text = path.read_bytes().decode()
    ours = Schedule.from_csv(text)
    assert ours.to_csv() == text
    simulate(ours)


def _to_torch(entry):
    from torch.distributed.pipelining.schedules import (
        OVERLAP_F_B,
        _Action,
        _ComputationType,
    )

    if isinstance(entry, Overlap):
        return _Action(-1, OVERLAP_F_B, None, tuple(_to_torch(a) for a in entry.parts))
    return _Action(entry.stage, _ComputationType.from_str(entry.kind), entry.microbatch)


@pytest.mark.parametrize("name", [f.name for f in pipesched.families() if f.name != "dualpipe"])
def test_our_lowering_is_torchs_lowering_of_the_same_compute_schedule(name):
    """Placed as torch's full lowering places them (_add_unshard_reshard with its window of 3,
    _add_reduce_grad, _add_send_recv), cell for cell."""
    from torch.distributed.pipelining.schedules import (
        _add_reduce_grad,
        _add_send_recv,
        _add_unshard_reshard,
    )

    from pipesched.runtime.program.program import lower_all

    compared = 0
    for p, m in ((2, 4), (4, 8), (3, 5), (2, 7)):
        try:
            schedule = build_schedule(name, p, m)
        except pipesched.ConfigError:
            continue
        compute = {r: _add_reduce_grad(_add_unshard_reshard([_to_torch(a) for a in schedule.rank_entries(r)]), m)
                   for r in range(p)}
        theirs = _add_send_recv(compute, lambda s: schedule.placement[s], schedule.stages)
        assert [program.cells() for program in lower_all(schedule)] == [[str(a) for a in theirs[r]] for r in range(p)]
        compared += 1
    assert compared > 0


@pytest.mark.parametrize("name", ["zb-v", "interleaved-1f1b", "interleaved-zb", "dualpipev"])
def test_compute_comms_csvs_cross_both_ways_with_torch(tmp_path, name):
    """torch takes our program as written, and the one it lowers itself is ours, cell for cell
    (UNSHARD/RESHARD included)."""
    from pipesched.runtime.program.program import lower_all
    from pipesched.schedule_files import csv_text, parse_csv

    schedule = build_schedule(name, 4, 8)
    ours = tmp_path / "ours.csv"
    ours.write_text(csv_text(schedule, "compute_comms"), newline="")
    runtime = _mock_runtime(4, 2, 8)
    runtime._load_csv(str(ours), format="compute_comms")
    assert [[str(a) for a in runtime.pipeline_order_with_comms[r]] for r in range(4)] == [
        p.cells() for p in lower_all(schedule)]
    compute = tmp_path / "compute.csv"
    compute.write_text(schedule.to_csv(), newline="")
    runtime = _mock_runtime(4, 2, 8)
    runtime._load_csv(str(compute), format="compute_only")  # torch lowers it itself
    theirs = tmp_path / "theirs.csv"
    runtime._dump_csv(str(theirs), format="compute_comms")
    text = theirs.read_text()
    assert "UNSHARD" in text and "RESHARD" in text
    assert parse_csv(text).orders == schedule.orders
    assert text.splitlines() == csv_text(schedule, "compute_comms").splitlines()
