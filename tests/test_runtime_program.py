"""Each rank's program: sends after their producers, receives posted in link order ahead of need,
one reduction per stage after its last gradient, and no run that can hang.

torch's own lowering of the same compute schedules is compared in test_vs_torch.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipesched
from pipesched.actions import Action, Overlap
from pipesched.errors import ConfigError, DeadlockError, ScheduleError
from pipesched.ops import RECEIVES, SENDS, Op
from pipesched.runtime.program.instructions import Instruction, RankProgram
from pipesched.runtime.program.program import lower, lower_all
from pipesched.runtime.program.program_check import check_programs

RECV_F, RECV_B, REDUCE_GRAD = Op.RECV_F, Op.RECV_B, Op.REDUCE_GRAD


def _every_family():
    for family in pipesched.families():
        for ranks, m in ((2, 4), (4, 8), (3, 5)):
            try:
                yield family.name, pipesched.build_schedule(family.name, ranks, m)
            except ConfigError:
                pass  # a layout the family refuses (dualpipe at odd ranks, ...)


CASES = list(_every_family())


@pytest.mark.parametrize("name,schedule", CASES, ids=[f"{n}-{s.ranks}x{s.microbatches}" for n, s in CASES])
def test_every_family_runs_to_the_end_with_blocking_receives_and_rendezvous_sends(name, schedule):
    programs = lower_all(schedule)
    check_programs(programs)
    assert [p.actions for p in programs] == [schedule.rank_actions(r) for r in range(schedule.ranks)]


def test_every_family_of_several_pipelines_and_overlapped_pairs_is_covered():
    assert {"dualpipe", "dualpipev", "zb-v", "interleaved-zb", "1f1b", "gpipe"} <= {n for n, _ in CASES}
    assert any(s.pipelines == 2 for _, s in CASES) and any(s.overlapped for _, s in CASES)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from([f.name for f in pipesched.families()]),
    ranks=st.integers(1, 5),
    microbatches=st.integers(1, 12),
    chunks=st.one_of(st.none(), st.integers(1, 3)),
)
def test_any_built_schedule_lowers_to_programs_that_cannot_hang(name, ranks, microbatches, chunks):
    try:
        schedule = pipesched.build_schedule(name, ranks, microbatches, chunks)
    except ConfigError:
        return
    programs = lower_all(schedule)
    check_programs(programs)
    sent = sorted(i.message for p in programs for i in p.instructions if i.op in SENDS)
    consumed = sorted(i.receives for p in programs for i in p.instructions if i.receives is not None)
    assert sent == consumed and len(set(sent)) == len(sent)  # each message sent once, consumed once


def test_sends_follow_their_producer_and_receives_precede_their_consumer():
    schedule = pipesched.build_schedule("interleaved-1f1b", 2, 4)
    for program in lower_all(schedule):
        code = program.instructions
        for n, ins in enumerate(code):
            if ins.op in SENDS:
                producer = code[n - 1]
                assert producer.sends == ins.message and producer.action.stage == ins.stage
            if ins.receives is not None:
                posted = [i for i in code[:n] if i.op in (RECV_F, RECV_B)]
                assert ins.receives in [i.message for i in posted]


def test_instructions_print_in_torchs_lowered_grammar():
    code = lower(pipesched.build_schedule("1f1b", 2, 2), 0).cells()
    assert code == ["0UNSHARD", "0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1",
                    "0REDUCE_GRAD", "0RESHARD"]
    receiver = lower(pipesched.build_schedule("1f1b", 2, 2), 1)
    assert str(receiver.instructions[1]) == "1RECV_F0" and receiver.instructions[1].peer == 0


def test_the_turn_of_a_v_hands_over_in_memory():
    schedule = pipesched.build_schedule("zb-v", 2, 4)
    turn = [i for p in lower_all(schedule) for i in p.instructions if i.action is not None and i.stage in (1, 2)]
    forwards_out = [i for i in turn if i.op is Op.F and i.stage == 1]
    assert forwards_out and all(i.local_output and i.sends is None for i in forwards_out)
    assert all(i.local_input and i.receives is None for i in turn if i.op is Op.F and i.stage == 2)
    messages = {i.message for p in lower_all(schedule) for i in p.instructions if i.message is not None}
    assert messages and not any((m.kind, m.stage) in (("act", 1), ("grad", 2)) for m in messages)


def test_an_overlapped_pair_is_two_halves_with_both_inputs_received_first():
    schedule = pipesched.build_schedule("dualpipev", 2, 6)
    for program in lower_all(schedule):
        code = program.instructions
        for n, ins in enumerate(code):
            if ins.half != 1:
                continue
            second = code[n + 1]
            assert second.half == 2 and ins.op is Op.F and second.op.is_backward
            posted = {i.message for i in code[:n] if i.op in (RECV_F, RECV_B)}
            assert {m for m in (ins.receives, second.receives) if m is not None} <= posted
        pairs = [c for c in program.cells() if c.endswith("OVERLAP_F_B")]
        assert len(pairs) == sum(isinstance(e, Overlap) for e in schedule.rank_entries(program.rank))


def test_each_stage_reduces_once_right_after_its_last_gradient():
    schedule = pipesched.build_schedule("zb-h1", 3, 5)
    for program in lower_all(schedule):
        code = program.instructions
        reductions = [n for n, i in enumerate(code) if i.op == REDUCE_GRAD]
        assert [code[n].stage for n in reductions] == [program.rank]
        last_w = max(n for n, i in enumerate(code) if i.op is Op.W)
        assert reductions[0] > last_w
        assert all(code[n].op in SENDS or code[n].op in RECEIVES for n in range(last_w + 1, reductions[0]))


def _edit(programs, rank, instructions):
    return [replace(p, instructions=tuple(instructions)) if p.rank == rank else p for p in programs]


def test_a_receive_posted_too_early_is_named_as_a_hang():
    programs = lower_all(pipesched.build_schedule("1f1b", 2, 4))
    code = list(programs[0].instructions)
    recv = next(n for n, i in enumerate(code) if i.op == RECV_B)
    code.insert(0, code.pop(recv))  # rank 0 waits for a gradient before sending any activation
    with pytest.raises(DeadlockError, match="rank 0 waits at 0RECV_B0"):
        check_programs(_edit(programs, 0, code))


def test_receives_out_of_link_order_and_misplaced_reductions_are_refused():
    programs = lower_all(pipesched.build_schedule("gpipe", 2, 4))
    code = list(programs[1].instructions)
    first, second = [n for n, i in enumerate(code) if i.op == RECV_F][:2]
    code[first], code[second] = code[second], code[first]
    with pytest.raises(ScheduleError, match="link 0->1"):
        check_programs(_edit(programs, 1, code))
    code = [i for i in programs[0].instructions if i.op != REDUCE_GRAD]
    with pytest.raises(ScheduleError, match="never reduces the gradients of stages \\[0\\]"):
        check_programs(_edit(programs, 0, code))
    code.insert(0, Instruction(REDUCE_GRAD, 0))
    with pytest.raises(ScheduleError, match="reduces stage 0 before its 0B0"):
        check_programs(_edit(programs, 0, code))
    code = list(programs[0].instructions)
    code[1], code[2] = code[2], code[1]  # 0SEND_F0 before 0F0 (after 0UNSHARD)
    with pytest.raises(ScheduleError, match="rank 0 sends .* before the action that computes it"):
        check_programs(_edit(programs, 0, code))


def test_a_schedule_that_deadlocks_cannot_be_lowered():
    schedule = pipesched.Schedule.from_orders([[Action(0, "F", 0), Action(0, "B", 0)], [Action(1, "B", 0), Action(1, "F", 0)]])
    with pytest.raises(DeadlockError, match="rank 0 at 0B0; rank 1 at 1B0"):
        lower_all(schedule)


def test_lowering_is_derived_once_per_schedule_object():
    schedule = pipesched.build_schedule("1f1b", 2, 4)
    assert lower_all(schedule) is lower_all(schedule)
    assert isinstance(lower(schedule, 1), RankProgram) and lower(schedule, 1) is lower_all(schedule)[1]


def test_lowering_is_torchs_passes_in_torchs_order_each_pure():
    from pipesched.runtime.program.passes import (
        LOWERING,
        add_reduce_grad,
        add_send_recv,
        add_unshard_reshard,
        compute_programs,
    )

    assert LOWERING == (add_unshard_reshard, add_reduce_grad, add_send_recv)
    schedule = pipesched.build_schedule("interleaved-zb", 2, 4)
    programs = compute_programs(schedule)
    before = [list(p) for p in programs]
    for lowering_pass in LOWERING:
        lowered = lowering_pass(programs, schedule)
        assert [list(p) for p in programs] == before  # a pass returns new programs, its input untouched
        programs, before = lowered, [list(p) for p in lowered]
    assert [p.instructions for p in lower_all(schedule)] == list(programs)


def test_gathers_open_a_window_of_three_stages_ahead_and_every_compute_runs_inside_one():
    schedule = pipesched.build_schedule("interleaved-1f1b", 2, 8, 3)  # three stages a rank: all fit the window
    for program in lower_all(schedule):
        ops = [i.op for i in program.instructions]
        assert ops.count(Op.UNSHARD) == ops.count(Op.RESHARD) == 3
        assert program.cells()[:3] == [f"{s}UNSHARD" for s in (program.rank, program.rank + 2, program.rank + 4)]
    schedule = pipesched.build_schedule("interleaved-1f1b", 2, 8, 4)  # four stages a rank: one waits its turn
    code = list(lower(schedule, 0).instructions)
    assert [i.op for i in code].count(Op.UNSHARD) > 4
    first = next(n for n, i in enumerate(code) if i.action is not None)
    with pytest.raises(ScheduleError, match="while stage 0 is not gathered"):
        check_programs(_edit(lower_all(schedule), 0, [i for i in code if not (i.op is Op.UNSHARD and i.stage == 0)]))
    assert code[first - 1].op is Op.UNSHARD
