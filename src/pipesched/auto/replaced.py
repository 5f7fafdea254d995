"""zb-auto's second round: its best candidates again, with their W passes re-placed for the costs.

Each re-placement executes the whole program once (:func:`~.search.with_weights_replaced`) and
was then simulated to be ranked: at the 1T layout's sizes a third of zb-auto's build. Two facts
skip work without changing the winner (ranking keeps the earlier of equal keys: the pool's leader
before any re-placement, an earlier re-placement before a later one):

- a re-placement with the same orders as a leader or an earlier re-placement has that one's key,
  so it cannot win: it is not simulated again;
- under the makespan objective the re-placement's execution times every action as the simulator
  does (the same sums in the same order), and the makespan is at least any action's end: once an
  action ends after the best makespan so far (by more than :data:`MARGIN`, which covers the 10
  significant digits ranking compares), the re-placement is slower; its execution stops there.
"""

from __future__ import annotations

import math
import weakref
from typing import Optional

from ..costs import Costs
from ..schedule import Schedule
from ..schedules.choose import ranked_schedules
from .search import with_weights_replaced

FILL_PARTIAL_WAITS = (False, True)  # W into the waits a W fits, then into every wait
MARGIN = 2e-9  # relative: a makespan this far above a 10-significant-digit key ranks above it
REPLACEMENT_COST = 2  # schedules one re-placement is charged as (planning.py): its execution, then its simulation


def replaced_ranked(leaders: list[Schedule], best_key: Optional[tuple], costs: Costs, limit: float,
                    objective: str, origins: dict) -> list:
    """(key, order, schedule, SimResult) of the ``leaders``' re-placements that may win, best
    first (``order``: the re-placement's place among all tried, leader by leader);
    ``best_key``: the key of the best candidate that stores its activations, which a
    re-placement must beat. Notes each kept one's origin in ``origins`` (by id)."""
    ranked: list = []
    known = [leader.orders for leader in leaders]
    for order, (leader, partial) in enumerate((l, p) for l in leaders for p in FILL_PARTIAL_WAITS):
        give_up = math.inf
        if objective == "makespan" and best_key is not None:
            give_up = min([best_key[0]] + [item[0][0] for item in ranked]) * (1 + MARGIN)
        variant = with_weights_replaced(leader, costs, limit, fill_partial_waits=partial, give_up_after=give_up)
        if variant is None or any(variant.orders == seen for seen in known):
            continue
        known.append(variant.orders)
        note_origin(origins, variant, origins[id(leader)] + " + W re-placed" + (" (partial waits too)" if partial else ""))
        ranked.extend((key, order, schedule, result)
                      for key, _, schedule, result in ranked_schedules([variant], costs, limit, objective))
    ranked.sort(key=lambda item: (item[0], item[1]))
    return ranked


def note_origin(origins: dict, schedule: Schedule, origin: str) -> None:
    """Note ``schedule``'s origin by id unless one is noted, for as long as it lives: the entry
    goes with it, so a later schedule given its id is not labelled with a freed one's origin."""
    if id(schedule) not in origins:
        origins[id(schedule)] = origin
        weakref.finalize(schedule, origins.pop, id(schedule), None)
