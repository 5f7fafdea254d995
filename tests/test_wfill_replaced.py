"""zb-auto's W re-placements skip work only where it cannot change the winner: the W placement's
execution times every action as the simulator does (so stopping once an action ends after the
best makespan so far is exact), and the round picks what ranking every re-placement would."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pipesched.auto.replaced import FILL_PARTIAL_WAITS, note_origin, replaced_ranked
from pipesched.auto.search import with_weights_replaced
from pipesched.costs import Costs
from pipesched.registry import build_schedule
from pipesched.schedules.choose import ranked_schedules
from pipesched.simulate import simulate

COSTS = [Costs(F=1, B=1.4, W=0.6, comm=0.1),
         Costs(F=1, B=2.1, W=0.35, comm=0.3, stage_multipliers=(1.3, 0.9, 1.1, 0.8, 1.2, 1.0))]
SEEDS = [("zb-h1", 6, 15, 6.0), ("zb-v", 6, 15, 6.0), ("zb-h2", 6, 15, 12.0), ("interleaved-zb", 6, 18, 6.0)]


@pytest.mark.parametrize("costs", COSTS)
@pytest.mark.parametrize("family, p, m, limit", SEEDS)
def test_the_w_placement_ends_exactly_when_the_simulator_says(costs, family, p, m, limit):
    """Given up just below the simulated makespan, the placement stops; at it, it does not: its
    last action ends at the simulator's makespan to the last bit (the same sums in the same order)."""
    seed = build_schedule(family, p, m, None, costs)
    for partial in FILL_PARTIAL_WAITS:
        placed = with_weights_replaced(seed, costs, limit, fill_partial_waits=partial)
        makespan = simulate(placed, costs).makespan
        again = with_weights_replaced(seed, costs, limit, fill_partial_waits=partial, give_up_after=makespan)
        assert again is not None and again.orders == placed.orders
        assert with_weights_replaced(seed, costs, limit, fill_partial_waits=partial,
                                     give_up_after=math.nextafter(makespan, 0.0)) is None


@pytest.mark.parametrize("costs", COSTS)
@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_the_round_picks_what_ranking_every_re_placement_picks(costs, objective):
    """Leaders as zb-auto ranks them; the reference simulates every re-placement. The winner
    (the pool's leader on ties) is the same schedule with the same key."""
    limit = 6.0
    seeds = [build_schedule(name, 6, 15, None, costs) for name in ("zb-h2", "zb-h1", "1f1b", "zb-v")]
    pool = ranked_schedules(seeds, costs, limit, objective)
    leaders = [schedule for _, _, schedule, _ in pool[:3]]
    every = [with_weights_replaced(s, costs, limit, fill_partial_waits=p) for s in leaders for p in FILL_PARTIAL_WAITS]
    reference = ranked_schedules(every, costs, limit, objective)
    kept = replaced_ranked(leaders, pool[0][0], costs, limit, objective, {id(s): "seed" for s in leaders})

    def winner(replaced: list) -> tuple:
        return min([(pool[0][0], 0, pool[0][2])] + [(key, 1, s) for key, _, s, _ in replaced[:1]],
                   key=lambda entry: entry[:2])

    assert reference and len(kept) <= len(reference)
    assert winner(kept)[0] == winner(reference)[0] and winner(kept)[2].orders == winner(reference)[2].orders


def test_an_origin_lives_as_long_as_its_schedule():
    """Origins are noted by id; a freed candidate's entry goes with it, so a later schedule that
    Python gives the same id is not labelled with the freed one's origin (a V program once came
    out as "1f1b + W re-placed")."""
    origins: dict = {}
    kept, freed = build_schedule("1f1b", 2, 4), replace(build_schedule("zb-h1", 2, 4))  # a copy: builds are memoized
    note_origin(origins, kept, "1f1b")
    note_origin(origins, kept, "offered again")  # the first origin stays: it wins ties
    note_origin(origins, freed, "zb-h1")
    freed_id = id(freed)
    del freed
    assert origins == {id(kept): "1f1b"} and freed_id not in origins
