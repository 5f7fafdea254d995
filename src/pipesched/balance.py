"""How many of a model's blocks (or layers) each stage holds: the one balancing rule.

A model is cut into contiguous stages of at least one block each. Among the cuts, the one taken
minimises the busiest rank's total cost first (a rank runs all its stages' work in every round:
an even split per stage that gives one rank two heavy stages is slower than an uneven one that
gives every rank the same total), then the slowest stage, then the sum of the stages' squared
costs (of two cuts with the same slowest stage, the more even: 10 equal blocks on 4 stages are
``2,2,3,3``, not ``1,3,3,3``), extra blocks going to later stages where stages tie. ``train`` cuts its models with it
(:func:`balanced_counts`), and the advisor its layers (:func:`balance_layers`, the same rule with
the embedding and the head as blocks of their own), so the split the advisor prints is the one
train takes for the same costs.

Two exact searches minimise those costs: when every block but the first and the last costs the
same (every model pipesched builds, and the advisor's transformers) counts suffice and large
models are cut at once; otherwise every cut is tried (an even split past ``max_tries``).
"""

from __future__ import annotations

import itertools
import math
from typing import Optional, Sequence

from .errors import ConfigError
from .execution import TOLERANCE


def even_counts(num_blocks: int, stages: int) -> list[int]:
    """Blocks per stage as even as possible, the extra ones on the last stages (a model's last
    block is often a light head); more stages than blocks is a ConfigError."""
    if stages > num_blocks:
        raise ConfigError(
            f"{stages} stages but the model has only {num_blocks} blocks: use fewer ranks or chunks "
            f"(at most {num_blocks} stages)"
        )
    base, extra = divmod(num_blocks, stages)
    return [base + (s >= stages - extra) for s in range(stages)]


def balanced_counts(block_costs: Sequence[float], placement: Sequence[int], max_tries: int = 200_000) -> list[int]:
    """Blocks per stage for ``block_costs`` under ``placement`` (stage -> rank), by the rule of
    the module docstring."""
    n, stages = len(block_costs), len(placement)
    even_counts(n, stages)  # the same refusal
    middle = block_costs[1:-1]
    if n > 2 and stages > 1 and middle[0] > 0 and all(abs(c - middle[0]) <= TOLERANCE * middle[0] for c in middle):
        return _counted(block_costs, placement)
    if math.comb(n - 1, stages - 1) > max_tries:
        return even_counts(n, stages)
    return _tried(block_costs, placement)


def balance_layers(
    layers: int, stages: int, layer_cost: float, first_extra: float, last_extra: float,
    rank_of_stage: Optional[Sequence[int]] = None, first_alone: bool = False,
) -> tuple[int, ...]:
    """Layers per stage by the same rule: the first stage's extra work (the embedding; any
    work when ``first_alone``) and the last's (the head) are blocks of their own, so a stage
    holding one may hold no layer at all (as Megatron-LM's ``--account-for-*-in-pipeline-split``
    allow). Without ``rank_of_stage`` each stage is its own rank."""
    lead = first_extra > 0 or first_alone
    tail = last_extra > 0
    least = stages - (lead and stages > 1) - tail if stages > 1 else 1 - (lead or tail)
    if layers < least:
        raise ConfigError(f"{stages} stages need at least {least} layers, the model has {layers}")
    costs = [first_extra] * lead + [layer_cost] * layers + [last_extra] * tail
    counts = balanced_counts(costs, rank_of_stage if rank_of_stage is not None else range(stages))
    counts[0] -= lead
    counts[-1] -= tail
    return tuple(counts)


def split_key(costs: Sequence[float], counts: Sequence[int], placement: Sequence[int]) -> tuple[float, float, float]:
    """What the rule minimises, in order: the busiest rank's total, the slowest stage, the sum of
    the stages' squared costs (rounded, so that sums of floats compare equal)."""
    start, per_rank, loads = 0, {}, []
    for s, count in enumerate(counts):
        loads.append(sum(costs[start:start + count]))
        start += count
        per_rank[placement[s]] = per_rank.get(placement[s], 0.0) + loads[-1]
    return round(max(per_rank.values()), 9), round(max(loads), 9), round(sum(x * x for x in loads), 9)


def _tried(costs: Sequence[float], placement: Sequence[int]) -> list[int]:
    """Every cut tried; of those with the least key, the one with its blocks latest."""
    n, stages = len(costs), len(placement)
    best, best_key = None, None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        counts = [b - a for a, b in zip((0, *cuts), (*cuts, n))]
        key = split_key(costs, counts, placement)
        if best_key is None or key <= best_key:  # combinations come earliest cuts first: keep the last
            best, best_key = counts, key
    return best


def _counted(costs: Sequence[float], placement: Sequence[int]) -> list[int]:
    """The rule's split when the blocks between the first and the last cost the same ``c``:
    stage ``s`` holding ``k`` blocks costs ``k*c + extra[s]`` (the first and last stages' extras
    are their end blocks' difference from ``c``), so the least rank and stage loads are found by
    bisection over the loads a count gives, and within them one block at a time goes to the
    cheapest stage that may take it (the latest of equals): for a sum of squares under caps per
    stage and per rank, that greedy is optimal."""
    n, stages, c = len(costs), len(placement), costs[1]
    extra = [0.0] * stages
    extra[0] += costs[0] - c
    extra[-1] += costs[-1] - c
    ranks = sorted(set(placement))
    mine = {r: [s for s in range(stages) if placement[s] == r] for r in ranks}

    def caps(rank_load: float, stage_load: float) -> Optional[tuple[list[int], dict[int, int]]]:
        """Most blocks per stage and per rank within the loads (None: some stage cannot hold one)."""
        per_stage = [math.floor((stage_load - extra[s]) / c + TOLERANCE) for s in range(stages)]
        per_rank = {r: math.floor((rank_load - sum(extra[s] for s in mine[r])) / c + TOLERANCE) for r in ranks}
        if min(per_stage) < 1 or any(per_rank[r] < len(mine[r]) for r in ranks):
            return None
        return per_stage, per_rank

    def fits(rank_load: float, stage_load: float) -> bool:
        held = caps(rank_load, stage_load)
        return held is not None and sum(min(held[1][r], sum(held[0][s] for s in mine[r])) for r in ranks) >= n

    top = sum(abs(x) for x in costs) + 1.0
    rank_load = _least(sorted({k * c + sum(extra[s] for s in mine[r]) for r in ranks for k in range(1, n + 1)}),
                       lambda load: fits(load, top))
    stage_load = _least(sorted({k * c + extra[s] for s in range(stages) for k in range(1, n + 1)}),
                        lambda load: fits(rank_load, load))
    per_stage, per_rank = caps(rank_load, stage_load)
    counts = [1] * stages
    room = {r: per_rank[r] - len(mine[r]) for r in ranks}
    for _ in range(n - stages):
        s = min((s for s in range(stages) if counts[s] < per_stage[s] and room[placement[s]] > 0),
                key=lambda s: (counts[s] * c + extra[s], -s))
        counts[s] += 1
        room[placement[s]] -= 1
    return counts


def _least(loads: list[float], feasible) -> float:
    """The smallest of the sorted ``loads`` that is feasible (feasibility grows with the load)."""
    lo, hi = 0, len(loads) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(loads[mid]):
            hi = mid
        else:
            lo = mid + 1
    return loads[lo]
