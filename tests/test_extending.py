"""Adding a family is one module and one registration (docs/extending.md): the toy family below
shows up in ``list``, ``compare``, ``advise`` and zb-auto's seeds without a change elsewhere."""

from __future__ import annotations

import json

import pytest

from pipesched import build_schedule, simulate
from pipesched.actions import F, I, W
from pipesched.advise import advise
from pipesched.advise.explain import why
from pipesched.auto.search import all_candidates
from pipesched.cli import main
from pipesched.costs import Costs
from pipesched.placement import loop_placement
from pipesched.registry import BuildRequest, Family, Placement, ZbAutoCandidate, register, unregister
from pipesched.schedule import Schedule

TOY = "toy-split-gpipe"


def build_toy(request: BuildRequest) -> Schedule:
    """GPipe with a split backward: all forwards, all input gradients, then all weight passes."""
    p, m = request.ranks, request.microbatches
    orders = tuple(
        tuple([F(s, k) for k in range(m)] + [I(s, k) for k in range(m)] + [W(s, k) for k in range(m)])
        for s in range(p)
    )
    return Schedule(p, m, loop_placement(p), orders, name=TOY)


def _cli(*args: str) -> None:
    """Run the command line in this process (a subprocess would not see the toy family)."""
    with pytest.raises(SystemExit) as done:
        main(list(args))
    assert done.value.code in (0, None)


@pytest.fixture
def toy_family():
    family = register(Family(
        name=TOY, build=build_toy, summary="GPipe with the backward split, for this test",
        placement=Placement.LOOP, split_backward=True, default_chunks=1, min_chunks=1, max_chunks=1,
        memory="m", why="a toy that holds every microbatch ({p} ranks)",
        zb_auto=ZbAutoCandidate(order=100),
    ))
    yield family
    unregister(TOY)


def test_a_registered_family_is_built_listed_compared_advised_and_seeds_zb_auto(toy_family, capsys):
    schedule = build_schedule(TOY, 2, 3)
    assert simulate(schedule).peak_memory == (3.0, 3.0)

    _cli("list")
    assert TOY in capsys.readouterr().out

    _cli("compare", "-p", "2", "-m", "3", "--json")
    rows = {row["schedule"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows[TOY]["makespan"] == simulate(schedule).makespan

    advice = advise(2, None, microbatches=3)
    toy = next(c for c in advice.candidates if c.schedule == TOY)
    assert why(toy, 2).startswith("a toy that holds every microbatch (2 ranks)")

    seeds = [origin for origin, _ in all_candidates(2, 3, Costs(), limit=2.0)]
    assert TOY in seeds and seeds.index(TOY) > seeds.index("1f1b")


def test_unregistering_removes_it_everywhere(toy_family):
    unregister(TOY)
    try:
        assert TOY not in {c.schedule for c in advise(2, None, microbatches=3).candidates}
        assert TOY not in [origin for origin, _ in all_candidates(2, 3, Costs(), limit=2.0)]
    finally:
        register(toy_family)  # the fixture unregisters it again
