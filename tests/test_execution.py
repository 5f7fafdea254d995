"""The execution rules, asked by every layer: dependencies, messages, latency, one tolerance."""

from __future__ import annotations

import re

import pytest
from conftest import SRC

import pipesched
from pipesched.actions import B, F, I, W
from pipesched.dependencies import Output, consumer_stage, dependency
from pipesched.costs import program_durations
from pipesched.errors import DeadlockError
from pipesched.execution import TOLERANCE, crosses_ranks, latency, run
from pipesched.execution import lower as execution_lower
from pipesched.lowering import MISSING, NO_DEPENDENCY
from pipesched.ops import Op
from pipesched.runtime.program.program import lower


def test_each_pass_waits_for_its_input():
    stages = 4
    assert dependency(F(0, 3), stages) is None
    assert dependency(F(2, 3), stages) == (1, Output.ACTIVATION, 3)
    assert dependency(I(1, 3), stages) == (2, Output.INPUT_GRAD, 3)  # whichever of I or B stage 2 runs
    assert dependency(B(3, 3), stages) == (3, Output.ACTIVATION, 3)  # the last stage turns around
    assert dependency(W(1, 3), stages) == (1, Output.INPUT_GRAD, 3)
    assert Output.INPUT_GRAD.makers == (Op.I, Op.B)
    assert dependency(I(1, 3), stages) == (2, "G", 3)  # the letters callers compared before still do


def _resolves_by_the_rule(orders, placement, pipelines: int = 1) -> None:
    """Each action's dependency id names what :func:`dependency` asks for (the first maker's kind
    the programs hold), MISSING where none runs it, and ``cross`` says whether it is a message."""
    program = execution_lower(orders, placement, pipelines)
    held = {a: i for i, a in enumerate(program.actions)}
    for i, (action, d) in enumerate(zip(program.actions, program.dep)):
        if not 0 <= action.stage < len(placement):
            assert d == MISSING
            continue
        need = dependency(action, len(placement), pipelines)
        if need is None:
            assert d == NO_DEPENDENCY
            continue
        stage, output, k = need
        makers = [held[(stage, kind, k)] for kind in output.makers if (stage, kind, k) in held]
        assert d == (makers[0] if makers else MISSING)
        assert program.cross[i] == (d >= 0 and crosses_ranks(placement, stage, action.stage))


@pytest.mark.parametrize("name", [f.name for f in pipesched.registry.families()])
def test_the_lowering_resolves_each_action_to_what_the_rule_names(name):
    for ranks, microbatches in ((4, 6), (2, 8)):
        family = pipesched.registry.get_family(name)
        schedule = pipesched.build_schedule(name, ranks, microbatches, max(family.min_chunks, 2)
                                            if family.max_chunks is None else family.min_chunks)
        orders = [schedule.rank_entries(r) for r in range(schedule.ranks)]
        _resolves_by_the_rule(orders, schedule.placement, schedule.pipelines)
        # broken programs too: an action dropped (its consumers find no maker), one on no stage,
        # one numbered past any microbatch: each waits for MISSING, none is a producer
        broken = [list(order) for order in orders]
        broken[-1] = broken[-1][1:] + [F(schedule.stages, 0), F(0, 10**6)]
        _resolves_by_the_rule(broken, schedule.placement, schedule.pipelines)


def test_the_consumer_of_an_output_is_the_stage_that_depends_on_it():
    stages = 4
    for action in (F(0, 0), F(2, 1), F(3, 1), I(3, 2), I(1, 0), B(0, 0), W(2, 1)):
        to = consumer_stage(action, stages)
        if to is None:
            assert action.kind is Op.W or action.stage in (0, stages - 1)
            continue
        waiting = F(to, action.microbatch) if action.kind is Op.F else I(to, action.microbatch)
        s, output, k = dependency(waiting, stages)
        assert (s, k) == (action.stage, action.microbatch) and action.kind in output.makers


def test_latency_only_between_ranks():
    v_placement = (0, 1, 1, 0)  # the V's turn (stages 1, 2) stays on rank 1
    assert not crosses_ranks(v_placement, 1, 2) and latency(v_placement, 1, 2, 0.5) == 0.0
    assert crosses_ranks(v_placement, 0, 1) and latency(v_placement, 0, 1, 0.5) == 0.5


@pytest.mark.parametrize("name", ["1f1b", "zb-v", "interleaved-zb", "v-min"])
def test_every_cross_rank_dependency_is_one_planned_message(name):
    schedule = pipesched.build_schedule(name, 3, 5)
    needs = {}
    for rank in range(schedule.ranks):
        program = lower(schedule, rank)
        needs.update({i.action: i.receives for i in program.instructions if i.receives is not None})
    for rank, action in schedule.actions():
        dep = dependency(action, schedule.stages)
        crossing = dep is not None and crosses_ranks(schedule.placement, dep[0], action.stage)
        assert (action in needs) == crossing
        if crossing:
            assert (needs[action].stage, needs[action].microbatch, needs[action].dst) == (dep[0], dep[2], rank)


def test_one_float_tolerance_for_the_whole_package():
    literal = re.compile(r"(?<![\w.])1e-9\b")
    restated = [
        f"{path.relative_to(SRC)}:{n}"
        for path in SRC.rglob("*.py")
        if path.name != "execution.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if literal.search(line.split("#")[0]) and "TOLERANCE" not in line
    ]
    assert restated == [] and TOLERANCE == 1e-9


@pytest.mark.parametrize("name, chunks", [("zb-h1", 1), ("interleaved-1f1b", 2)])
def test_the_plain_run_and_the_run_with_gathers_time_alike(name, chunks):
    # run() takes a tighter loop without pairs or gathers; with gathers that gather nothing it
    # takes the general one: the same rules, so the same floats
    schedule = pipesched.build_schedule(name, 4, 8, chunks)
    program = schedule.program
    costs = pipesched.Costs(F=1.0, B=1.3, W=0.7, comm=0.05, stage_overhead=0.1)
    durations = program_durations(program, costs)
    assert run(program, durations, costs.comm) == run(program, durations, costs.comm, [()] * len(program.actions))


def test_both_runs_name_the_same_deadlock():
    program = execution_lower([[F(0, 0), B(0, 0), F(0, 1), B(0, 1)], [F(1, 0), F(1, 1), B(1, 1), B(1, 0)]], (0, 1))
    messages = []
    for gathers in (None, [()] * len(program.actions)):
        with pytest.raises(DeadlockError) as err:
            run(program, [1.0] * len(program.actions), 0.0, gathers)
        messages.append(str(err.value))
    assert messages[0] == messages[1] and "rank 0 waits at 0B0 for 1B0 (rank 1)" in messages[0]
