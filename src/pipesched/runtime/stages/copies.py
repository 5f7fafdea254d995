"""The model copies of a schedule of several pipelines (DualPipe: two), as the runtime holds them.

A schedule with ``pipelines`` > 1 has ``pipelines x L`` stages: stage ``s`` runs the model's
stage ``s % L`` on its own pipeline's microbatches (:meth:`~pipesched.schedule.Schedule.stage_microbatches`).
Every copy of a model stage is built from the same seeded blocks, so the copies start equal.
Each copy's gradients come from its own share of the microbatches; their sum is the gradient of
the whole batch, so every rank all-reduces its gradients with the ranks holding the other
copies of its model stages (DualPipe: rank ``r`` with rank ``p-1-r``, which hold the copies of
model stages ``r`` and ``p-1-r``, DeepSeek's gradient all-reduce): each stage's as soon as this
rank's copy of it has done its last gradient action, while the pipeline's tail goes on (one
reduce item per model stage of :mod:`~pipesched.runtime.comm.reduction`, as data parallelism and
tied parameters are), and all of them done before the optimizer step.
Both copies then take the same optimizer step on the same gradients and stay equal, and every
rank's parameters keep the unpipelined model's names, so a checkpoint holds one copy however
many ranks write it (DCP keeps one of equal entries) and every copy loads from it.

For a one-pipeline schedule every stage is its own model stage and nothing is reduced.
"""

from __future__ import annotations

from typing import Sequence

from ...errors import ConfigError
from ...schedule import Schedule
from .partition import balanced_counts


class ModelCopies:
    """Which model stage each of the schedule's stages runs, and where each pipeline starts and ends."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.length = schedule.pipeline_length
        self.pipelines = schedule.pipelines
        self.placement = schedule.placement

    def model_stage(self, stage: int) -> int:
        """The model's stage (its blocks) that ``stage`` runs."""
        return self.schedule.model_stage(stage)

    def takes_inputs(self, stage: int) -> bool:
        """True for a pipeline's first stage: it reads the batch's inputs."""
        return stage % self.length == 0

    def computes_loss(self, stage: int) -> bool:
        """True for a pipeline's last stage: it computes the loss against the targets."""
        return (stage + 1) % self.length == 0

    def stage_ranges(self, model_ranges: list[range]) -> list[range]:
        """The blocks of every stage, given the blocks of every model stage."""
        return [model_ranges[self.model_stage(s)] for s in range(len(self.placement))]

    def copy_groups(self) -> list[tuple[int, ...]]:
        """The sets of pipeline ranks that hold the copies of the same model stages (one set per
        rank, each rank in exactly one; none for one pipeline). ConfigError for a placement
        whose copies cannot be summed rank with rank."""
        if self.pipelines == 1:
            return []
        holders = [tuple(sorted({self.placement[j + c * self.length] for c in range(self.pipelines)}))
                   for j in range(self.length)]
        groups = sorted(set(holders))
        held = {}
        for j, group in enumerate(holders):
            for rank in group:
                held.setdefault(rank, set()).add(j)
        for j, group in enumerate(holders):
            if len(group) != self.pipelines:
                raise ConfigError(f"a rank holds two copies of the model's stage {j}: the runtime sums the copies rank with rank")
        for group in groups:
            if len({frozenset(held[r]) for r in group}) != 1:
                raise ConfigError(
                    f"the copies of the model's stages are not held by ranks holding the same stages ({group}): "
                    "the runtime cannot sum their gradients rank with rank"
                )
        return groups


def input_ranks(schedule: Schedule) -> set[int]:
    """The pipeline ranks that read the batch's inputs (each pipeline's first stage)."""
    copies = ModelCopies(schedule)
    return {schedule.placement[s] for s in range(schedule.stages) if copies.takes_inputs(s)}


def loss_ranks(schedule: Schedule) -> set[int]:
    """The pipeline ranks that read the targets (each pipeline's last stage)."""
    copies = ModelCopies(schedule)
    return {schedule.placement[s] for s in range(schedule.stages) if copies.computes_loss(s)}


def balanced_block_counts(block_costs: Sequence[float], schedule: Schedule) -> list[int]:
    """Blocks per stage of one model copy that balance the ranks' loads under ``schedule`` (one
    count per model stage: ``p`` for DualPipe, not its ``2p`` stages). What ``pipesched train``
    and the benchmarks cut the model by when no counts are given: call this, not
    :func:`~pipesched.runtime.stages.partition.balanced_counts` on the schedule's placement."""
    return balanced_counts(block_costs, _balancing_placement(schedule))


def _balancing_placement(schedule: Schedule) -> tuple[int, ...]:
    """A placement of the model's stages for :func:`~pipesched.runtime.stages.partition.balanced_counts`:
    the schedule's own, or with several pipelines each model stage on the group of ranks that
    holds its copies (DualPipe: rank ``r`` runs model stages ``r`` and ``p-1-r`` on half the
    microbatches each, so the pair's blocks are what to balance)."""
    copies = ModelCopies(schedule)
    if schedule.pipelines == 1:
        return schedule.placement
    groups = copies.copy_groups()
    index = {rank: i for i, group in enumerate(groups) for rank in group}
    return tuple(index[schedule.placement[j]] for j in range(copies.length))
