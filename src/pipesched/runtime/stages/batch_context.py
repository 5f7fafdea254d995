"""A step's batch cut into microbatches, and its context: per-microbatch tensors no stage edge carries.

A stage of a Hugging Face decoder rebuilds its attention mask, position ids and rotary tables
from the batch rather than receiving them from the previous stage: only the hidden state
crosses. ``PipelineRuntime.step(inputs, targets, context)`` takes such a ``context``: a dict of
tensors whose dim 0 is the batch, **the same on every rank**. The runtime splits it into
microbatches (and shards it over data-parallel replicas) as it splits the inputs, and every
compute action of microbatch ``k`` (its F, I, B and W, each half of an overlapped pair, and a
recomputation inside a backward) passes microbatch ``k``'s slice to every block whose ``forward``
takes a ``context`` argument (:func:`~.partition.run_block`): an argument, never a global, so
ranks that share a process (:mod:`.local_transport`) and threads never see each other's.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...errors import ConfigError

Context = dict[str, torch.Tensor]


def split(context: Optional[Context], microbatches: int, device: torch.device) -> Optional[list[Context]]:
    """``context`` cut along dim 0 into ``microbatches`` dicts, on ``device`` (None for None)."""
    if context is None:
        return None
    if not isinstance(context, dict) or not all(isinstance(v, torch.Tensor) for v in context.values()):
        raise ConfigError("the batch context must be a dict of tensors (batch dim 0)")
    parts: list[Context] = [{} for _ in range(microbatches)]
    for name, tensor in context.items():
        if tensor.dim() == 0 or tensor.shape[0] % microbatches:
            raise ConfigError(
                f"the batch context's {name!r} of shape {tuple(tensor.shape)} does not split into "
                f"{microbatches} equal microbatches along dim 0"
            )
        for part, piece in zip(parts, tensor.to(device, non_blocking=True).chunk(microbatches)):
            part[name] = piece
    return parts


def microbatches(batch: Optional[torch.Tensor], m: int, device: torch.device, what: str,
                 rank: int) -> tuple[torch.Tensor, ...]:
    """``batch`` (the step's ``what``: inputs or targets) cut along dim 0 into ``m`` microbatches
    on ``device``; ConfigError when rank ``rank`` needs it and was given none, or it does not split."""
    if batch is None:
        raise ConfigError(f"rank {rank} holds a first or last stage and needs the {what}")
    if batch.shape[0] % m:
        raise ConfigError(f"the batch of {batch.shape[0]} does not split into {m} equal microbatches")
    return batch.to(device, non_blocking=True).chunk(m)


def shapes(context: Optional[Context]) -> Optional[tuple]:
    """What of a context decides the boundary shapes: its names, shapes and dtypes."""
    if context is None:
        return None
    return tuple((name, tuple(t.shape), t.dtype) for name, t in context.items())
