"""The execution rules, asked by every layer: dependencies, messages, latency, one tolerance."""

from __future__ import annotations

import re

import pytest
from conftest import SRC

import pipesched
from pipesched.actions import B, F, I, W
from pipesched.dependencies import Output, consumer_stage, dependency
from pipesched.execution import NO_DEPENDENCY, TOLERANCE, crosses_ranks, latency
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


@pytest.mark.parametrize("name", ["1f1b", "zb-v", "dualpipe", "dualpipev"])
def test_the_lowering_resolves_each_action_to_what_the_rule_names(name):
    schedule = pipesched.build_schedule(name, 4, 6)
    program = schedule.program
    for action, d in zip(program.actions, program.dep):
        need = dependency(action, schedule.stages, schedule.pipelines)
        if need is None:
            assert d == NO_DEPENDENCY
            continue
        stage, output, k = need
        made = program.actions[d]
        assert (made.stage, made.kind in output.makers, made.microbatch) == (stage, True, k)


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
