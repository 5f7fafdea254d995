"""Activation recomputation at block granularity (Megatron's full recompute, one layer at a time).

Each block of a recomputed stage is its own non-reentrant ``torch.utils.checkpoint`` region. Its
forward saves nothing inside the block: what lives on until the stage's backward is every block's
input (the region's argument, which checkpoint keeps to rerun the block). The backward rebuilds
the blocks one at a time, last first, so it holds the block inputs plus one block's activations,
never the whole stage's. RNG state is preserved per region (checkpoint's default), so dropout
draws the same masks when a block is rebuilt.

The stage runs through its own call (:meth:`~..stages.partition.Stage.forward` with each block
checkpointed), not block by block from here: a sharded stage is FSDP2's root module, whose
forward hook starts the state its blocks' groups share (their communication context, which the
stage's ``REDUCE_GRAD`` finalises); the blocks' own FSDP hooks are inside each region, and
FSDP2 leaves a rebuild's to its pre-backward hook, which already gathered the block's weights.
A recomputed stage thus computes on sharded (``dp_shard``, HSDP) and tensor-parallel stages
the gradients it computes without recomputation.

With a split backward the rebuilt tensors a Linear stashes for ``W`` outlive the rebuild: the
stash is the same with or without recomputation (see :mod:`.split_backward`).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Optional

from torch.utils.checkpoint import checkpoint

from ..metering.memory_meter import ActivationMeter
from ..stages.boundary import Value, flat
from ..stages.partition import Stage, run_block


def recomputed_forward(stage: Stage, x: Value, meter: Optional[ActivationMeter], context: Optional[dict] = None) -> Value:
    """``stage(x)`` with each block checkpointed on its own; the meter (on a metered step) counts
    every block input past the first (the stage input its caller counts) for as long as
    checkpoint keeps it, and the tensors a rebuild creates until they are freed. ``x`` and the blocks' values may be
    tuples or dicts of tensors (a :class:`~.boundary.Boundary`'s), each entry counted. ``context``
    (the microbatch's batch context) goes to every block that takes one, in the rebuild too."""
    last = stage.chain[-1][0]
    counted = {} if meter is None else {"context_fn": lambda: (nullcontext(), meter.recomputation())}

    def checkpointed(block, x: Value, context: Optional[dict], takes: bool) -> Value:
        y = checkpoint(run_block, block, x, context, takes, use_reentrant=False, **counted)
        if meter is not None and block is not last:
            for t in flat(y):
                meter.count_until_freed(t)
        return y

    return stage(x, context, run=checkpointed)
