"""Held-out evaluation: the mean loss of a fixed set of batches, forward only, no gradients.

In a pipeline (:func:`evaluate_pipeline`) each replica runs its shard of every batch through the
stages of one model copy in pipeline order, each on the rank that holds it: a rank runs its
stage's forward under ``torch.no_grad`` (and the run's autocast) and hands the output to the next
stage's rank. It uses the runtime's stages and nothing of its step (no program, transport, meter
or optimizer), so it can run between any two steps; the outputs cross ranks as pickled objects
(``send_object_list``: any boundary, a tuple or dict of tensors too), which costs more than the
step's transport but runs only every ``--eval-every`` steps. Every stage is put in eval mode
(dropout off) for it and back after.

A sharded stage (FSDP2, tensor parallelism: :mod:`~pipesched.runtime.sharding`) is gathered
before its forward and freed after it, by the same ``UNSHARD``/``RESHARD`` its runner does in a
step, and nothing is reduced (no gradients). Every rank of a stage runs the forward: the shards
of a data-parallel group on their own share of the batch, the ``tp`` ranks of a stage on the same
share (their row-parallel all-reduces need each other), so only ``tp`` coordinate 0 counts its
loss into the mean.

The loss of a batch is the loss function's mean over the whole shard, so with equal shards the
mean over replicas and batches is the one-process model's mean loss over the same batches
(:func:`evaluate_model`), up to the order of float sums.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..runtime.engine.shapes import placed

Batch = tuple[torch.Tensor, torch.Tensor]


def evaluate_model(md, model: nn.Module, batches: Sequence[Batch], autocast: Callable) -> float:
    """The one-process model ``model`` of ``md`` (its ModelDef)'s mean loss over ``batches``."""
    total = 0.0
    with _eval_mode([model]), torch.no_grad():
        for x, y in batches:
            with autocast():
                total += md.loss_fn(md.forward(model, x), y).item()
    return total / len(batches)


def evaluate_pipeline(runtime, batch_context: Callable[[torch.Tensor], Optional[dict]], batches: Sequence[Batch]) -> float:
    """The pipeline's mean loss over ``batches`` (every batch the global one), on every rank;
    ``batch_context``: a batch's context from its inputs (the ModelDef's). Collective: every rank
    of every replica calls it with the same batches."""
    mesh, placement, rank = runtime.mesh, runtime.schedule.placement, runtime.rank
    length = runtime.copies.length  # the first model copy's stages: 0 .. length - 1
    device = runtime.device
    counts = runtime.strategy.tp_rank == 0  # tp ranks compute the same loss
    total = 0.0
    with _eval_mode(runtime.stages.values()), torch.no_grad():
        for inputs, targets in batches:
            context = batch_context(inputs)
            if context is not None:
                context = {name: placed(mesh.shard(t), device) for name, t in context.items()}
            value = mesh.shard(inputs)
            for s in range(length):
                if placement[s] != rank:
                    continue
                if s > 0 and placement[s - 1] != rank:
                    value = _receive(mesh.global_rank(placement[s - 1]), device)
                value = _forward(runtime, s, placed(value, device), context)
                if s == length - 1 and counts:
                    with runtime.precision.autocast():
                        total += runtime.loss_fn(value, mesh.shard(targets).to(device)).item()
                if s < length - 1 and placement[s + 1] != rank:
                    _send(value, mesh.global_rank(placement[s + 1]))
    # the last stage's rank of each replica holds its replica's sum; the others add 0
    reduce_on = torch.device("cpu") if dist.get_backend() == "gloo" else device
    summed = torch.tensor([total], dtype=torch.float64, device=reduce_on)
    dist.all_reduce(summed, group=mesh.world_group)
    return summed.item() / (mesh.dp * len(batches))


def _forward(runtime, s: int, value, context):
    """Stage ``s``'s forward on ``value``: a sharded stage gathered for it and freed after (its
    :class:`~..engine.stage_runner.StagePart`'s; a whole stage's do nothing)."""
    part = runtime.runners[s].part
    part.unshard()
    part.ready()
    try:
        with runtime.precision.autocast(), part.forward():
            return runtime.stages[s](value, context)
    finally:
        part.reshard()


@contextmanager
def _eval_mode(modules) -> Iterator[None]:
    modules = list(modules)
    modes = [m.training for m in modules]
    for m in modules:
        m.train(False)
    try:
        yield
    finally:
        for m, mode in zip(modules, modes):
            m.train(mode)


def _send(value, dst: int) -> None:
    dist.send_object_list([placed(value, torch.device("cpu"))], dst=dst)


def _receive(src: int, device: torch.device):
    box = [None]
    dist.recv_object_list(box, src=src)
    return placed(box[0], device)
