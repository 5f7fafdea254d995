"""The batch context: per-microbatch tensors every stage may read, which never cross a stage edge.

A stage of a Hugging Face decoder rebuilds its attention mask, position ids and rotary tables
from the batch rather than receiving them from the previous stage: only the hidden state
crosses. ``PipelineRuntime.step(inputs, targets, context)`` takes such a ``context``: a dict of
tensors whose dim 0 is the batch, **the same on every rank**. The runtime splits it into
microbatches (and shards it over data-parallel replicas) as it splits the inputs, and every
compute action of microbatch ``k`` (its F, I, B and W, each half of an overlapped pair, and a
recomputation inside a backward) runs with microbatch ``k``'s slice current, which a block reads
with :func:`current` (None outside a step's actions, or when the step has no context).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import torch

from ..errors import ConfigError

Context = dict[str, torch.Tensor]

_current: Optional[Context] = None


def current() -> Optional[Context]:
    """The microbatch's batch context while one of its actions runs (a dict of tensors), else None."""
    return _current


def set_current(context: Optional[Context]) -> None:
    """Make ``context`` current (the engine's call before each action)."""
    global _current
    _current = context


@contextmanager
def using(context: Optional[Context]) -> Iterator[None]:
    """``context`` current within the block, the previous one restored after it."""
    previous = _current
    set_current(context)
    try:
        yield
    finally:
        set_current(previous)


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


def shapes(context: Optional[Context]) -> Optional[tuple]:
    """What of a context decides the boundary shapes: its names, shapes and dtypes."""
    if context is None:
        return None
    return tuple((name, tuple(t.shape), t.dtype) for name, t in context.items())
