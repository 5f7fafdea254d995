"""Bytes a rank holds for a stage's parameters, gradients and optimizer state under a layout.

Pure (no torch): the advisor and ``simulate`` predict memory from parameter shapes before any
rank starts, and the runtime's measurement of a sharded stage is checked against it.

How a parameter is cut (what ``parallelize_module`` then ``fully_shard`` do in torch 2.13):

- tensor parallelism splits one dimension ``tp`` ways (a column-wise Linear its output rows, a
  row-wise Linear its input columns; :data:`TP_STYLES`), or none (norms, embeddings, the head:
  replicated on every ``tp`` rank);
- FSDP then splits dim 0 of the tensor-parallel piece ``dp_shard`` ways.

Both cut as ``torch.chunk`` does: pieces of ``ceil(n / k)`` rows, the last ones shorter or empty,
so a rank's share depends on its coordinates. FSDP keeps each sharded parameter in a buffer
padded to the full ``ceil(n / k)`` rows, and reduce-scatters the gradients into one padded
buffer per group; the optimizer's state is allocated like the unpadded piece
(``zeros_like``), plus one scalar ``step`` per parameter (AdamW's, a 4-byte float).
Replicas (``dp_replicate``) hold whole copies of their shard: they change nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Iterable, Optional

from .parallel_layout import ParallelLayout

# style -> (weight dim, bias dim) split by tensor parallelism, for a Linear's (out, in) weight;
# a transposed Linear (GPT-2's Conv1D, weight (in, out)) splits the other weight dim
TP_STYLES = {"colwise": (0, 0), "rowwise": (1, None)}
STEP_BYTES = 4  # AdamW's step counter, a float32 scalar tensor per parameter


@dataclass(frozen=True)
class ParamSpec:
    """One parameter as the planner sees it: its full shape, the dim tensor parallelism splits
    (None: replicated across ``tp``) and its bytes per element."""

    shape: tuple[int, ...]
    tp_dim: Optional[int] = None
    element_bytes: int = 4


@dataclass(frozen=True)
class StateBytes:
    """Bytes one rank holds for a stage, between steps (sharded) and while gathered."""

    params: int  # sharded parameters (FSDP's padded buffers)
    grads: int  # sharded gradients after the reduce-scatter (padded)
    optimizer: int  # optimizer state (``slots`` tensors like each piece, plus the step scalars)
    gathered_params: int  # the stage's parameters all-gathered (inside the unshard window)
    unsharded_grads: int  # full-size gradients held from the first backward until REDUCE_GRAD

    @property
    def steady(self) -> int:
        """What stays between steps: parameters, gradients and optimizer state."""
        return self.params + self.grads + self.optimizer


def tp_dims(style: str, transposed: bool = False) -> tuple[int, Optional[int]]:
    """(weight dim, bias dim) that tensor-parallel ``style`` splits (bias None: replicated)."""
    weight, bias = TP_STYLES[style]
    return (1 - weight if transposed else weight), bias


def chunk_rows(n: int, k: int, i: int) -> int:
    """Rows piece ``i`` of ``torch.chunk(n rows, k)`` holds (pieces of ``ceil(n/k)``, then what is left)."""
    size = -(-n // k)
    return max(0, min(size, n - i * size))


def tp_piece(spec: ParamSpec, tp: int, tp_rank: int) -> tuple[int, ...]:
    """The shape of ``spec`` on tensor-parallel rank ``tp_rank`` of ``tp``."""
    shape = list(spec.shape)
    if spec.tp_dim is not None and tp > 1:
        shape[spec.tp_dim] = chunk_rows(shape[spec.tp_dim], tp, tp_rank)
    return tuple(shape)


def shard_elements(spec: ParamSpec, layout: ParallelLayout, tp_rank: int, shard_rank: int) -> tuple[int, int]:
    """(elements held, elements in FSDP's padded buffer) of ``spec`` on the rank at those coordinates."""
    piece = tp_piece(spec, layout.tp, tp_rank)
    if not piece:  # a scalar is not split
        return 1, 1
    rest = prod(piece[1:])
    held = chunk_rows(piece[0], layout.dp_shard, shard_rank) * rest
    return held, -(-piece[0] // layout.dp_shard) * rest


def rank_state_bytes(specs: Iterable[ParamSpec], layout: ParallelLayout, tp_rank: int = 0, shard_rank: int = 0,
                     slots: int = 2) -> StateBytes:
    """What the rank at (``tp_rank``, ``shard_rank``) holds for a stage of ``specs`` (each
    parameter once, tied ones included once), with ``slots`` optimizer tensors per parameter
    (AdamW: 2; SGD without momentum: 0, and then no step scalar)."""
    params = optimizer = gathered = 0
    for spec in specs:
        held, padded = shard_elements(spec, layout, tp_rank, shard_rank)
        params += padded * spec.element_bytes
        optimizer += slots * held * spec.element_bytes + (STEP_BYTES if slots else 0)
        gathered += prod(tp_piece(spec, layout.tp, tp_rank)) * spec.element_bytes
    return StateBytes(params, params, optimizer, gathered, gathered)


def largest_rank_state_bytes(specs: Iterable[ParamSpec], layout: ParallelLayout, slots: int = 2) -> StateBytes:
    """The rank that holds the most (steady bytes) among the layout's tp x dp_shard coordinates:
    the figure a memory limit is checked against."""
    specs = list(specs)
    every = (rank_state_bytes(specs, layout, t, s, slots) for t in range(layout.tp) for s in range(layout.dp_shard))
    return max(every, key=lambda b: (b.steady, b.gathered_params))


def empty_shards(specs: Iterable[ParamSpec], layout: ParallelLayout) -> list[tuple[int, int]]:
    """(tp rank, shard rank) coordinates that would hold no element of the stage's parameters."""
    specs = list(specs)
    return [(t, s) for t in range(layout.tp) for s in range(layout.dp_shard)
            if not any(shard_elements(spec, layout, t, s)[0] for spec in specs)]
