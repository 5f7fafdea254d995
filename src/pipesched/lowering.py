"""Lowering: per-rank programs numbered with integer ids, each action's dependency resolved
once to the id of the action that makes its input, so that :func:`pipesched.execution.run`
(and the validator, the memory peaks and the durations) index lists and arrays instead of
asking the rule (:mod:`pipesched.dependencies`, through its tables) per action.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import repeat
from operator import itemgetter
from typing import Sequence

import numpy as np

from .actions import Action, Overlap, Slot, sub_actions
from .dependencies import dependencies
from .ops import Op

NO_DEPENDENCY = -1
MISSING = -2


@dataclass(frozen=True)
class Program:
    """Per-rank programs lowered to integer ids, each with its dependency's id."""

    actions: list[Action]  # by id
    rank_ids: list[range]  # per rank, its ids in program order (consecutive)
    dep: list[int]  # id of the dependency, NO_DEPENDENCY or MISSING
    cross: list[bool]  # True when the dependency lives on another rank
    rank_of: list[int]  # rank of each id
    placement: tuple[int, ...]
    partner: list[int]  # for an overlapped pair's forward: its backward's id (which follows); else -1
    pipelines: int  # model copies the stages form (see dependency)
    paired: bool  # some rank overlaps a pair (partner holds an id)
    stage: np.ndarray = field(compare=False)  # per id, its stage and its kind's number in KINDS (codes)
    kind: np.ndarray = field(compare=False)
    micro: np.ndarray = field(compare=False)  # per id, its microbatch

    @cached_property
    def index(self) -> dict:
        """Action -> id (a duplicated action keeps its last id): made when first asked (the
        validator's explanations, the runtime's gather plan), not by every lowering."""
        return dict(zip(self.actions, range(len(self.actions))))


def lower(orders: Sequence[Sequence[Slot]], placement: Sequence[int], pipelines: int = 1) -> Program:
    """Number the actions (an overlapped pair's two halves in a row) and resolve every
    dependency to an id: the first of its makers' kinds that the programs hold (``pipelines``
    as in :func:`~pipesched.dependencies.dependency`)."""
    actions: list[Action] = []
    rank_ids: list[range] = []
    rank_of: list[int] = []
    partner: list[int] = []
    for r, order in enumerate(orders):
        first = len(actions)
        if Overlap in set(map(type, order)):
            for entry in order:
                parts = sub_actions(entry)
                partner.extend([len(actions) + 1, -1] if len(parts) == 2 else [-1])
                actions.extend(parts)
        else:  # no pairs: the entries are the actions (the common case, without a call per action)
            actions.extend(order)
            partner.extend([-1] * len(order))
        rank_of.extend([r] * (len(actions) - first))
        rank_ids.append(range(first, len(actions)))
    stage, kind = codes(actions)
    micro = np.fromiter(map(itemgetter(2), actions), np.int64, len(actions))
    dep, cross = _resolve(actions, stage, kind, micro, rank_of, len(placement), pipelines)
    return Program(actions, rank_ids, dep, cross, rank_of, tuple(placement), partner, pipelines,
                   max(partner, default=-1) >= 0, stage, kind, micro)


KINDS = (Op.F, Op.I, Op.W, Op.B)  # the compute kinds, numbered for arrays (another kind: len(KINDS))


def codes(actions: Sequence[Action]) -> tuple[np.ndarray, np.ndarray]:
    """The actions' stages and kinds (numbered as in :data:`KINDS`) as arrays, made in C loops."""
    n = len(actions)
    code = {kind: c for c, kind in enumerate(KINDS)}
    return (np.fromiter(map(itemgetter(0), actions), np.int64, n),
            np.fromiter(map(code.get, map(itemgetter(1), actions), repeat(len(KINDS))), np.int64, n))


def _looked_up(action: Action, index: dict, inputs: dict) -> int:
    """One action's dependency id found in ``index`` (action -> id), the slow way."""
    need = inputs[action[1]][action[0]]
    found = () if need is None else (index.get((need[0], maker, action[2])) for maker in need[1])
    return NO_DEPENDENCY if need is None else next((d for d in found if d is not None), MISSING)


def _resolve(actions: Sequence[Action], stage: np.ndarray, kind: np.ndarray, micro: np.ndarray,
             rank_of: Sequence[int], stages: int, pipelines: int) -> tuple[list[int], list[bool]]:
    """Each action's dependency id (the first of its makers' kinds the programs hold, as
    :class:`~pipesched.dependencies.Dependencies` tabulates the rule; NO_DEPENDENCY, or MISSING
    for an input no action makes and an action on no stage) and whether it crosses ranks.
    Array lookups in an id table of (stage, kind, microbatch): a dictionary lookup per action
    cost most of a lowering at p = 64, m = 512."""
    n = len(actions)
    if not n:
        return [], []
    code = {kind: c for c, kind in enumerate(KINDS)}
    # a dense table of ids holds the actions numbered within what n actions can hold (each of a
    # pipeline's microbatches has a forward and a backward on every stage): at most ~5n ids; an
    # action on no stage waits for MISSING (validation names it), one numbered past is looked up
    known = (stage >= 0) & (stage < stages) & (kind < len(KINDS)) & (micro >= 0) & (micro * stages < n * pipelines)
    row, col, at = np.where(known, stage, stages), np.where(known, kind, len(KINDS)), np.where(known, micro, 0)
    ids = np.full((stages + 1, len(KINDS) + 1, int(at.max()) + 1), MISSING, np.int64)
    ids[row, col, at] = np.arange(n)
    ids[stages] = MISSING  # where the others were parked: no one's producer
    # per (stage, kind): producer stage and up to two maker kinds (stage ``stages``: no producer)
    producer = np.full((stages + 1, len(KINDS) + 1), stages, np.int64)
    makers = np.full((stages + 1, len(KINDS) + 1, 2), len(KINDS), np.int64)
    free = np.zeros((stages + 1, len(KINDS) + 1), bool)
    inputs = dependencies(stages, pipelines).inputs
    for c, k in enumerate(KINDS):
        for s, need in enumerate(inputs[k]):
            if need is None:
                free[s, c] = True
                continue
            producer[s, c] = need[0]
            makers[s, c, :len(need[1])] = [code[m] for m in need[1]]
    dep, second = (ids[producer[row, col], makers[row, col, j], at] for j in (0, 1))
    dep = np.where(dep >= 0, dep, second)
    dep = np.where(free[row, col], NO_DEPENDENCY, np.where(dep >= 0, dep, MISSING))
    past = np.flatnonzero(~known & (stage >= 0) & (stage < stages) & (kind < len(KINDS))).tolist()
    index = dict(zip(actions, range(n))) if past else {}  # a duplicated action keeps its last id
    for i in past:
        dep[i] = _looked_up(actions[i], index, inputs)  # numbered past the table: its maker too
    ranks = np.asarray(rank_of, np.int64)
    cross = (dep >= 0) & (ranks[np.maximum(dep, 0)] != ranks)
    return dep.tolist(), cross.tolist()
