"""DualPipeV and the overlapped action (OVERLAP_F_B): grammar, cost, validation, drawing, torch.

torch's DualPipeV writes cells such as ``(0F3;3B1)OVERLAP_F_B``: a forward and a backward run
together. pipesched prints and parses them exactly, prices them with the ``overlap`` factor
(``max + overlap * min`` of the halves), checks them, draws them as a split slot, and builds
the same DualPipeV order as torch (training equivalence: tests/test_runtime_equivalence.py).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesched import (
    Costs,
    CSVFormatError,
    Schedule,
    ScheduleError,
    build_schedule,
    simulate,
    validate,
)
from pipesched.actions import Action, Overlap, parse_slot
from pipesched.errors import DeadlockError
from pipesched.placement import v_placement


def test_overlap_prints_and_parses_in_torch_grammar():
    pair = Overlap(Action(0, "F", 3), Action(3, "B", 1))
    assert str(pair) == "(0F3;3B1)OVERLAP_F_B"
    assert parse_slot(" (0F3;3B1)OVERLAP_F_B ") == pair
    assert parse_slot("2I0") == Action(2, "I", 0)


@pytest.mark.parametrize("text", ["(0B3;3B1)OVERLAP_F_B", "(0F3;3W1)OVERLAP_F_B", "(0F3)OVERLAP_F_B",
                                  "(0F3;3B1)OVERLAP", "(0F3;3B1;1F0)OVERLAP_F_B"])
def test_malformed_overlaps_are_refused(text):
    with pytest.raises(CSVFormatError):
        parse_slot(text)


def _one_rank(*entries) -> Schedule:
    """Rank 0 holding both stages of a one-rank V."""
    return Schedule(1, 2, v_placement(1), (tuple(entries),))


@pytest.mark.parametrize("overlap", [0.0, 0.5, 1.0])
def test_a_pair_takes_the_longer_half_plus_overlap_times_the_shorter(overlap):
    fwd, bwd = Action(0, "F", 1), Action(0, "B", 0)
    schedule = _one_rank(Action(0, "F", 0), Action(1, "F", 0), Action(1, "B", 0), Overlap(fwd, bwd),
                         Action(1, "F", 1), Action(1, "B", 1), Action(0, "B", 1))
    costs = Costs(F=1, B=1, W=1, overlap=overlap)
    result = simulate(validate(schedule), costs)
    spans = {span.action: span for span in result.timeline[0]}
    # one rank holds 2 stages: F costs 1/2, a full backward (B+W)/2 = 1; the pair follows 0F0 1F0 1B0
    assert spans[fwd].start == spans[bwd].start == 2.0
    assert spans[fwd].end == spans[bwd].end == pytest.approx(2.0 + 1 + overlap * 0.5)
    assert result.busy[0] == pytest.approx(4 * 0.5 + 4 * 1 - (1 - overlap) * 0.5)


def test_a_pair_waits_for_both_inputs():
    schedule = build_schedule("dualpipev", 2, 4)
    pair_rank, pair = next((r, e) for r in range(2) for e in schedule.rank_entries(r) if isinstance(e, Overlap))
    spans = {s.action: s for s in simulate(schedule, Costs(comm=0.3)).timeline[pair_rank]}
    assert spans[pair.forward].start == spans[pair.backward].start


def test_a_pair_whose_backward_needs_its_own_forward_is_refused():
    last = 1  # stage 1 is the last stage of a one-rank V: its backward needs its forward
    schedule = _one_rank(Action(0, "F", 0), Overlap(Action(last, "F", 0), Action(last, "B", 0)),
                         Action(0, "B", 0), Action(0, "F", 1), Action(1, "F", 1), Action(1, "B", 1),
                         Action(0, "B", 1))
    with pytest.raises(ScheduleError, match="halves must be independent"):
        validate(schedule)


def test_a_pair_that_waits_on_a_later_action_deadlocks_naming_the_half():
    p = 2
    orders = [list(build_schedule("dualpipev", p, 4).rank_entries(r)) for r in range(p)]
    first_pair = next(i for i, e in enumerate(orders[1]) if isinstance(e, Overlap))
    pair = orders[1].pop(first_pair)
    orders[1].insert(first_pair - 1, pair)  # ahead of the backward that its backward needs
    with pytest.raises(DeadlockError, match=rf"rank 1 waits at {pair.backward} for"):
        validate(Schedule(p, 4, v_placement(p), tuple(map(tuple, orders))))


@settings(max_examples=20, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 24))
def test_dualpipev_is_valid_for_any_ranks_and_microbatches_at_p_plus_half(p, m):
    schedule = build_schedule("dualpipev", p, m)
    assert schedule.placement == v_placement(p)
    assert simulate(schedule).max_peak_memory <= p + 0.5
    assert Schedule.from_csv(schedule.to_csv()).orders == schedule.orders


def test_with_perfect_overlap_dualpipev_beats_zb_v_at_the_same_memory():
    """DeepSeek's claim for MoE models, where F&B hides communication: at overlap 0 a pair costs
    its longer half only, so the steady state runs faster than ZB-V's one action at a time."""
    for p, m in ((4, 16), (8, 32)):
        dual = simulate(build_schedule("dualpipev", p, m), Costs(overlap=0))
        zbv = simulate(build_schedule("zb-v", p, m, memory_limit=dual.max_peak_memory))
        assert dual.makespan < zbv.makespan


def test_drawings_split_an_overlapped_slot_in_two_half_boxes():
    from pipesched.render.layout import ROW_H, build_chart
    from pipesched.render.timeline import Timeline

    result = simulate(build_schedule("dualpipev", 2, 4))
    chart = build_chart(Timeline.from_sim(result))
    pair = next(e for e in result.schedule.rank_entries(0) if isinstance(e, Overlap))
    halves = [b for b in chart.boxes if b.tip.startswith(f"{pair.forward} ") or b.tip.startswith(f"{pair.backward} ")]
    assert sorted(b.h for b in halves) == [ROW_H / 2, ROW_H / 2]
    assert halves[0].x == halves[1].x and abs(halves[0].y - halves[1].y) == ROW_H / 2


def test_overlapped_halves_run_one_after_the_other_on_a_cpu_and_are_marked_for_cuda_streams():
    torch = pytest.importorskip("torch")
    from pipesched.runtime.engine.overlap_streams import OverlapStreams
    from pipesched.runtime.program.program import lower

    schedule = build_schedule("dualpipev", 1, 8)
    code = [i for i in lower(schedule, 0).instructions if i.action is not None]
    pairs = [e for e in schedule.rank_entries(0) if isinstance(e, Overlap)]
    # each pair is a forward half (half 1) right before its backward half (half 2) in the program
    assert [Overlap(a.action, b.action) for a, b in zip(code, code[1:]) if a.half == 1] == pairs
    assert all(b.half == 2 for a, b in zip(code, code[1:]) if a.half == 1)
    # on a CPU nothing moves to another stream, even when asked
    streams = OverlapStreams(torch.device("cpu"), enabled=True)
    assert not streams.active and streams.side is None
