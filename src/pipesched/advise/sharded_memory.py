"""Bytes a rank holds besides activations, for any layout, from its stages' parameter shapes.

One function, :func:`rank_state_bytes`, for the advisor (shapes from a model description,
:func:`transformer_stage_shapes`) and for the runtime (shapes of the modules it built), so that
predicted and measured bytes are compared against one formula. A stage is a list of
``(numel, tp_sharded)`` entries, one per FSDP unit (a transformer block, the embedding, the
head) or per parameter: ``numel`` counts the unsharded elements; ``tp_sharded`` says tensor
parallelism splits them ``tp`` ways (attention and MLP matrices, the vocabulary) rather than
replicating them (norms, biases of row-parallel layers).

What a rank holds, after TP has split what it splits (Rajbhandari et al. 2020 for the states,
torch's FSDP2 under pipelining for the rest):

- ``sharded``: parameters, gradients and optimizer state, each ``1/dp_shard`` (FSDP2 keeps the
  fp32 parameter and its gradient in the shard: :class:`Precision`);
- ``gathered``: with ``dp_shard > 1``, the unsharded parameters of the gathered window (torch's
  pipelining keeps a stage gathered from its first forward to its last backward: torchtitan
  sets ``reshard_after_forward=False`` under PP; the window is every local stage by default);
- ``unsharded_grads``: with ``dp_shard > 1``, the full-size gradients each stage accumulates
  from its first backward until its ``REDUCE_GRAD`` (pipelining turns FSDP's reduce-scatter off
  for every microbatch but the end), in the reduce dtype;
- ``buffers``: the flat all-gather output and reduce-scatter input of the largest unit, live
  while a collective runs.

Replicas (``dp_replicate``) hold a whole copy each: they divide nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..errors import ConfigError

ParamShape = tuple[int, bool]  # (unsharded elements, split by tensor parallelism?)


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter element of each kind of state."""

    param: int = 4  # the sharded parameter (FSDP2's fp32 master copy)
    grad: int = 4  # its sharded gradient
    optimizer: int = 8  # Adam's two moments
    gathered: int = 2  # an all-gathered parameter (MixedPrecisionPolicy's param_dtype, bf16)
    unsharded_grad: int = 4  # a gradient accumulated unsharded until REDUCE_GRAD (reduce_dtype, fp32)

    @property
    def per_sharded_param(self) -> int:
        return self.param + self.grad + self.optimizer


MIXED = Precision()  # torchtitan's FSDP2 mixed precision (bf16 compute, fp32 reduce) with Adam
FP32 = Precision(gathered=4)  # everything in fp32 (the runtime's CPU runs)


@dataclass(frozen=True)
class RankBytes:
    """One rank's bytes besides activations (see the module doc)."""

    sharded: float
    gathered: float = 0.0
    unsharded_grads: float = 0.0
    buffers: float = 0.0

    @property
    def total(self) -> float:
        return self.sharded + self.gathered + self.unsharded_grads + self.buffers


def local_numel(shapes: Sequence[ParamShape], tp: int) -> float:
    """Elements of ``shapes`` one TP rank holds before FSDP shards them."""
    return sum(n / tp if split else n for n, split in shapes)


def rank_state_bytes(
    stages: Sequence[Sequence[ParamShape]],
    dp_shard: int = 1,
    tp: int = 1,
    precision: Precision = MIXED,
    window: Optional[int] = None,
    grads_held: Optional[int] = None,
) -> RankBytes:
    """Bytes of the rank holding ``stages`` (its local stages, each a list of shapes).

    ``window``: how many stages are gathered at once (the largest ones count; default all);
    ``grads_held``: how many stages hold unsharded gradients at the peak (default all: every
    stage's first backward comes before the first ``REDUCE_GRAD`` under the schedules the
    advisor builds, and zero-bubble schedules defer their ``W`` further)."""
    for label, value in (("dp_shard", dp_shard), ("tp", tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{label} must be a whole number of at least 1, got {value!r}")
    per_stage = sorted((local_numel(s, tp) for s in stages), reverse=True)
    sharded = precision.per_sharded_param * sum(per_stage) / dp_shard
    if dp_shard == 1:
        return RankBytes(sharded)
    window = len(per_stage) if window is None else window
    held = len(per_stage) if grads_held is None else grads_held
    largest_unit = max((n / tp if split else n for s in stages for n, split in s), default=0.0)
    return RankBytes(
        sharded,
        gathered=precision.gathered * sum(per_stage[:window]),
        unsharded_grads=precision.unsharded_grad * sum(per_stage[:held]),
        buffers=(precision.gathered + precision.unsharded_grad) * largest_unit,
    )


def layer_shapes(hidden: int) -> list[ParamShape]:
    """One transformer block as two entries: its ``12h^2`` matrix elements (split by TP) and its
    ``13h`` biases and norms (replicated; the advisor's ``12h^2 + 13h`` per layer)."""
    return [(12 * hidden * hidden, True), (13 * hidden, False)]


def transformer_stage_shapes(hidden: int, vocab: Optional[int], layers_per_stage: Sequence[int]) -> list[list[ParamShape]]:
    """Per stage, its blocks' shapes, with the embedding on the first and the head on the last
    (``V x h`` each, split by TP along the vocabulary)."""
    stages = [layer_shapes(hidden) * n for n in layers_per_stage]
    if vocab:
        stages[0] = [(vocab * hidden, True)] + stages[0]
        stages[-1] = stages[-1] + [(vocab * hidden, True)]
    return stages
