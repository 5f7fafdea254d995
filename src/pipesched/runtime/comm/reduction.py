"""The gradient reduction plan: which gradients are summed with which ranks, by what divisor, when.

Three things make the same weight live on several ranks, and all three are one rule here:

- data-parallel replicas (each holds every stage of its pipeline rank: their mean),
- a schedule of several pipelines (DualPipe's model copies: their sum),
- parameters **tied** across stages (an embedding and a head that are one weight: the
  holders' sum).

Every parameter of this rank belongs to one **reduce item**: the tied group it is part of, or
else its model stage. An item's *holders* are the pipeline ranks holding any copy of it; its
all-reduce runs over the holders in every replica and divides by the replicas, so one
all-reduce gives the copies' and holders' sum and the replicas' mean at once. Items whose
holders are this rank alone and with one replica need nothing. How many replicas one all-reduce
spans is the runtime strategy's (``replicas``): every one for whole stages, one for sharded
stages, whose gradients FSDP reduced over the data-parallel ranks already. Two holders on one rank (a V
placement puts the first and last stage on rank 0) share one ``Parameter``, whose gradient
already sums both; on sharded stages each stage holds its own copy (:mod:`.tied`), whose
reduced gradients are added into the first's before the item's all-reduce (or alone, when
nothing else holds it) and given back after.

An item's all-reduce starts at the last ``REDUCE_GRAD`` of this rank's program (:mod:`.program`)
among the stages holding it (a ``REDUCE_GRAD`` names its stage; the plan knows which items that
stage completes): right after the last action that adds to its gradients (a stage's
last ``W``, or ``B``), while the rest of the pipeline goes on. The items of one process group must
be started in the same order on each of its ranks (collectives pair one for one): the plan reads
every rank's order off the programs, and where a group's
ranks disagree (a CSV whose copies finish in other orders), or ``overlap`` is off, that group's
items start after the step's last action, in item order. Missing gradients of an item held by
several pipeline ranks are zeros (a copy no microbatch reached must still match its peer's
buckets).

An expert-parallel rank's experts (:mod:`..sharding.expert_parallel`) are no item: each EP rank
holds other experts, so they are summed only with the ranks holding the same ones (the mesh's
expert replicas), at the step's end, and divided as the items are (missing gradients are zeros:
an expert no token reached this step still decays, as the one process's stacked weight does);
experts FSDP shards over those ranks (``ParallelLayout.expert_shards``) are reduced by FSDP's
reduce-scatter, so here they are only counted.

The plan also says, for the gradient norm, which parameters this rank counts: each item on its
lowest holder only, so every weight counts once. The bucketed all-reduces themselves are
:class:`~pipesched.runtime.comm.grad_sync.Reducer`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from ...errors import ConfigError
from ...ops import Op
from ...schedule import Schedule
from ..program.program import lower
from ..stages.copies import ModelCopies
from .expert_mesh import is_expert
from .grad_sync import Reducer
from .tied_copies import add_copies, give_copies

ItemKey = tuple  # ("stage", model stage) or ("tied", group index)


def block_of(name: str) -> int:
    """The block a parameter belongs to, from its unpipelined name (``"5.head.weight"``: 5)."""
    head = name.partition(".")[0]
    if not head.isdigit():
        raise ConfigError(f"tied parameter {name!r} is not named as named_parameters() names it ('<block>.<name>')")
    return int(head)


@dataclass(frozen=True)
class ItemLayout:
    """Where a reduce item lives: its holders and, in each holder's program, the item's last
    REDUCE_GRAD (its position, for the order items start in, and the stage it names)."""

    key: ItemKey
    holders: tuple[int, ...]
    ready: dict  # pipeline rank -> (position, stage) of the item's last REDUCE_GRAD there (None: none)
    source: int = 0  # a tied group's: the lowest holder of its first name, whose value is the group's


def item_layouts(schedule: Schedule, stage_ranges: Sequence[range], tied: Sequence[Sequence[str]]) -> list[ItemLayout]:
    """Every reduce item of the model, the same on every rank (from the schedule alone)."""
    placement = schedule.placement
    members: dict[ItemKey, set[int]] = {}  # item -> the schedule stages holding it
    sources: dict[ItemKey, int] = {}
    for s in range(schedule.stages):
        members.setdefault(("stage", schedule.model_stage(s)), set()).add(s)
    for g, names in enumerate(tied):
        blocks = {block_of(n) for n in names}
        for b in blocks:
            if not any(b in r for r in stage_ranges):
                raise ConfigError(f"tied parameter names block {b}, but the model has blocks 0..{max(r[-1] for r in stage_ranges)}")
        members[("tied", g)] = {s for s, r in enumerate(stage_ranges) if blocks & set(r)}
        sources[("tied", g)] = min(placement[s] for s, r in enumerate(stage_ranges) if block_of(names[0]) in r)
    layouts = []
    for key in sorted(members):
        stages = members[key]
        holders = tuple(sorted({placement[s] for s in stages}))
        ready = {}
        for rank in holders:
            reduced = {ins.stage: (i, ins.stage) for i, ins in enumerate(lower(schedule, rank).instructions)
                       if ins.op is Op.REDUCE_GRAD}
            done = [reduced.get(s) for s in stages if placement[s] == rank]
            ready[rank] = None if None in done else max(done)
        layouts.append(ItemLayout(key, holders, ready, sources.get(key, holders[0])))
    return layouts


def overlappable(layouts: Sequence[ItemLayout], holders: tuple[int, ...]) -> bool:
    """Whether every rank of ``holders`` finishes the items they reduce together in one order."""
    items = [lay for lay in layouts if lay.holders == holders]
    orders = set()
    for rank in holders:
        if any(lay.ready[rank] is None for lay in items):
            return False
        orders.add(tuple(lay.key for lay in sorted(items, key=lambda lay: (lay.ready[rank], lay.key))))
    return len(orders) == 1


class ReductionPlan:
    """This rank's reduce items, their process groups, when each starts, and what it counts."""

    def __init__(self, schedule: Schedule, stage_ranges: Sequence[range], tied: Sequence[Sequence[str]],
                 stages: dict[int, nn.Module], mesh, overlap: bool, timeout_s: float, replicas: Optional[int] = None,
                 copies: Optional[dict[int, list[nn.Parameter]]] = None) -> None:
        """``replicas``: how many of ``mesh``'s replicas each all-reduce spans and divides by, all
        (the default) or 1; ``copies``: each tied group's copies on this rank (:func:`.tied.held`),
        the first the optimizer's."""
        self.rank = rank = mesh.pp_rank
        self.mesh = mesh
        self.replicas = replicas = mesh.dp if replicas is None else replicas
        if replicas not in (1, mesh.dp):
            raise ValueError(f"a reduction spans one replica or all {mesh.dp}, not {replicas}")
        if schedule.pipelines > 1:
            ModelCopies(schedule).copy_groups()  # refuses a rank holding two copies of a model stage
        layouts = item_layouts(schedule, stage_ranges, tied)
        self.groups = _make_groups(layouts, mesh, timeout_s, replicas)
        tied_names = {n: g for g, names in enumerate(tied) for n in names}
        others = {("tied", g): group[1:] for g, group in (copies or {}).items() if len(group) > 1}
        followers = {id(p) for group in others.values() for p in group}
        params: dict[ItemKey, list[nn.Parameter]] = {}
        self.experts: list[nn.Parameter] = []
        for s, stage in stages.items():
            for name, p in stage.global_named_parameters():
                if is_expert(p):
                    if all(p is not q for q in self.experts):
                        self.experts.append(p)
                    continue
                key = ("tied", tied_names[name]) if name in tied_names else ("stage", schedule.model_stage(s))
                bucket = params.setdefault(key, [])
                if p.requires_grad and id(p) not in followers and all(p is not q for q in bucket):
                    bucket.append(p)
        if self.experts and schedule.pipelines > 1:
            raise ConfigError("expert parallelism runs with one model copy per schedule (not DualPipe's two)")
        self.counted: list[nn.Parameter] = list(self.experts)  # whose gradients this rank counts in the norm
        self.ready_at: dict[int, list] = {}  # stage -> items its REDUCE_GRAD completes (started there)
        self.at_end: list = []
        overlap_of = {lay.holders: overlap and overlappable(layouts, lay.holders) for lay in layouts}
        for lay in layouts:
            if rank not in lay.holders or lay.key not in params:
                continue
            if rank == lay.holders[0]:
                self.counted.extend(params[lay.key])
            group = self.groups.get(lay.holders)
            if group is None and lay.key not in others:
                continue
            item = (lay.key, params[lay.key], group, len(lay.holders) > 1, others.get(lay.key, ()))
            if overlap_of[lay.holders]:
                self.ready_at.setdefault(lay.ready[rank][1], []).append(item)
            else:
                self.at_end.append(item)
        for items in self.ready_at.values():
            items.sort(key=lambda item: item[0])
        self.reducer = Reducer(replicas)
        self.tied_layouts = {lay.key[1]: lay for lay in layouts if lay.key[0] == "tied"}

    @property
    def reduces(self) -> bool:
        return bool(self.ready_at or self.at_end)

    def reduce_grad(self, stage: int) -> None:
        """Stage ``stage``'s REDUCE_GRAD: start the items it completes."""
        for item in self.ready_at.get(stage, ()):
            self._start(item)

    def _start(self, item: tuple) -> None:
        _key, params, group, zero_missing, others = item
        if others:
            add_copies(params[0], others)
        if group is not None:
            self.reducer.start(params, group, zero_missing)

    def finish(self) -> None:
        """Start what waits for the step's end, then wait for every reduction of the step; the
        other copies of a tied weight on this rank get the reduced gradient."""
        for item in self.at_end:
            self._start(item)
        self._reduce_experts()
        self.reducer.finish()
        for items in (*self.ready_at.values(), self.at_end):
            for _key, params, _group, _zero, others in items:
                give_copies(params[0], others)

    def _reduce_experts(self) -> None:
        """Sum the experts' gradients over the ranks holding the same experts, divided as the items are."""
        whole = [p for p in self.experts if not isinstance(p, DTensor)]  # FSDP reduced the sharded ones
        if not whole:
            return
        group = self.mesh.experts.replicas_group
        if group is not None:
            self.reducer.start(whole, group, zero_missing=True)
            return
        for p in whole:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif self.replicas != 1:
                p.grad.div_(self.replicas)

    def broadcast_group(self, g: int) -> Optional[tuple[Any, int]]:
        """(process group, global source rank) that gives tied group ``g`` its value: its holders
        in the replicas its reductions span, from the lowest holder of its first name in the first of
        them; None when this rank holds none of it or no other rank does."""
        lay = self.tied_layouts[g]
        if self.rank not in lay.holders:
            return None
        group = self.groups.get(lay.holders)
        if group is None or lay.holders == (self.rank,) and self.mesh.dp == 1:
            return None
        first_row = self.mesh.grid[self.mesh.dp_rank - self.mesh.dp_rank % self.replicas]
        return group, first_row[lay.source]


def _make_groups(layouts: Sequence[ItemLayout], mesh, timeout_s: float, replicas: int) -> dict[tuple[int, ...], Any]:
    """One process group per distinct set of holders that needs a reduction: over every replica
    (``replicas`` all of them), or over the holders of one data rank (``replicas`` 1: sharded
    stages, each holding its own shard). Creating a group takes the whole world: every rank
    creates every group, in one order; a single holder's group is the data-parallel one (None
    with one replica: nothing left to reduce)."""
    groups: dict[tuple[int, ...], Any] = {}
    mine = mesh.grid[mesh.dp_rank]
    for holders in sorted({lay.holders for lay in layouts}):
        if len(holders) == 1:
            if replicas > 1 and holders[0] == mesh.pp_rank:
                groups[holders] = mesh.dp_group
            continue
        for grid in mesh.grids:
            for rows in (grid,) if replicas > 1 else ([row] for row in grid):
                made = dist.new_group([row[r] for row in rows for r in holders], timeout=timedelta(seconds=timeout_s))
                if mesh.pp_rank in holders and (mine in rows):
                    groups[holders] = made
    return groups

