"""What a W placement knows of its candidates without simulating is what simulation says.

interleaved-zb chooses among its candidates (:func:`pipesched.schedules.interleaved.pick_fastest`)
from the times and peaks their W placement reports (:class:`pipesched.schedules.wfill.Built`):
the placement is an execution under the same rules, durations and float operations as the
simulator, so its makespan, span and peak must equal the simulation's exactly, not
approximately; and choosing from them must pick what simulating every candidate picks.
"""

from __future__ import annotations

import pytest

from pipesched import Costs, simulate
from pipesched.ops import Op
from pipesched.placement import loop_placement
from pipesched.schedules.interleaved import pick_fastest, rank_order
from pipesched.schedules.interleaved_zb import WARMUPS_PER_HOP, _weight_placements

# uneven stages, a latency, and passes of unequal cost: the fill's waits are partial and its
# W placement differs between the two wait rules
SKEWED = Costs(F=1.0, B=1.3, W=0.7, comm=0.15, stage_multipliers=(1.1, 1.0, 1.0, 0.9, 1.0, 1.0, 1.0, 1.3))


def _candidates(p: int, m: int, v: int, costs: Costs, limit: float) -> list:
    """interleaved-zb's candidates in its order: each warm-up depth, each W placement."""
    out = []
    for warmup_per_hop in WARMUPS_PER_HOP:  # the deeper warm-up holds more: peaks differ
        skeleton = [rank_order(r, p, m, v, p, warmup_per_hop, backward=Op.I) for r in range(p)]
        out += _weight_placements(skeleton, loop_placement(p, v), m, costs, limit)
    return out


@pytest.mark.parametrize("limit", [4.0, 2.5])  # the default (p), and one under which the fill frees memory
def test_every_placements_times_and_peak_are_the_simulations(limit):
    for candidate in _candidates(4, 10, 2, SKEWED, limit):
        result = simulate(candidate.schedule, SKEWED)
        assert (candidate.makespan, candidate.span, candidate.peak) == (
            result.makespan, result.span, result.max_peak_memory)


# every candidate fits (time decides); the shallow warm-up's fit and the deep one's are over;
# all are over (the least over, then time)
@pytest.mark.parametrize("limit", [6.0, 4.0, 2.5])
def test_choosing_from_what_is_known_picks_what_simulating_all_picks(limit):
    candidates = _candidates(4, 10, 2, SKEWED, limit)
    simulated_all = pick_fastest([c.schedule for c in candidates], SKEWED, limit)
    assert pick_fastest(candidates, SKEWED, limit).orders == simulated_all.orders
