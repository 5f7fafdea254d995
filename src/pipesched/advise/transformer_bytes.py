"""A transformer's bytes per rank under a layout: :mod:`pipesched.sharded_bytes`'s rules applied to
the shapes a transformer of given sizes has (:meth:`~.transformer.TransformerSpec.layer_specs`).

Every block of a transformer has the same shapes, so a rank's bytes are those of one block times
its blocks, plus the embedding and the head where it holds them: each of the three counted once
per layout (:func:`unit_bytes`, kept); and a search asks for the same few ranks (a count of
blocks, with or without an end) again and again, so each rank's bytes are kept too: ``advise
--gpus 512`` asks about a hundred thousand times.

With experts (:mod:`.transformer_experts`) a block holds ``routed/ep`` routed experts, which FSDP
shards over the data-parallel ranks EP leaves (``dp_shard / gcd(dp_shard, ep)``: EP borrows its
ranks from ``dp_shard`` first, torchtitan's convention), and the first ``dense_layers`` blocks a
dense MLP instead: they are the first stage's (on the rank holding it, as many as it holds).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from math import gcd

from ..parallel_layout import ParallelLayout
from ..sharded_bytes import (
    FP32,
    NOTHING,
    Precision,
    RankBytes,
    StateBytes,
    rank_bytes,
    rank_state_bytes,
)
from .transformer import TransformerSpec

FSDP_BLOCKS_WITHOUT_PP = 2  # blocks gathered (and gradients unsharded) at once when FSDP reshards after forward


@lru_cache(maxsize=256)
def unit_bytes(spec: TransformerSpec, layout: ParallelLayout, slots: int, precision: Precision = FP32,
               vocab_parallel: bool = True, tp_rank: int = 0, shard_rank: int = 0,
               ep: int = 1) -> tuple[StateBytes, ...]:
    """(one block, the embedding, the head, one dense block) on the rank at (``tp_rank``,
    ``shard_rank``) of ``layout``; the default coordinates are the fullest rank's. Without
    experts the dense block is the block."""
    block, embedding, head, dense = (rank_state_bytes(specs, layout, tp_rank, shard_rank, slots, precision)
                                     for specs in (spec.layer_specs(), spec.embedding_specs(vocab_parallel),
                                                   spec.head_specs(vocab_parallel), spec.layer_specs(experts=False)))
    if spec.experts is None:
        return block, embedding, head, block
    experts_layout = replace(layout, dp_shard=layout.dp_shard // gcd(layout.dp_shard, ep))
    routed = rank_state_bytes(spec.experts.routed_specs(spec.hidden, ep), experts_layout, tp_rank,
                              shard_rank % experts_layout.dp_shard, slots, precision)
    return block + routed, embedding, head, dense


@lru_cache(maxsize=4096)
def transformer_rank_bytes(spec: TransformerSpec, layout: ParallelLayout, layers: int, first: bool, last: bool,
                           slots: int, precision: Precision = FP32, vocab_parallel: bool = True,
                           tp_rank: int = 0, shard_rank: int = 0, ep: int = 1) -> RankBytes:
    """One rank holding ``layers`` blocks, the embedding if ``first``, the head if ``last``.

    With a pipeline (``layout.pp > 1``) every local stage stays gathered from its first forward to
    its last backward (torchtitan's ``reshard_after_forward=False`` under PP): the rank's stages
    count as one. Without one, FSDP reshards each block after its forward and reduce-scatters
    after its backward, so :data:`FSDP_BLOCKS_WITHOUT_PP` units are gathered and unsharded at once;
    ZeRO-1 (``precision.zero1``) keeps its weights and gradients whole with or without one.
    The rank holding the first stage holds the first dense blocks (as many as its layers)."""
    layer, embedding, head, dense = unit_bytes(spec, layout, slots, precision, vocab_parallel, tp_rank, shard_rank, ep)
    denser = min(spec.dense_layers, layers) if first else 0
    units = [(layer, layers - denser), (dense, denser), (embedding, int(first)), (head, int(last))]
    largest = max((u for u, n in units if n), key=lambda u: u.gathered_params, default=NOTHING)
    if layout.pp == 1 and layout.dp_shard > 1 and not precision.zero1:
        stages = [u for u, n in units for _ in range(n)]
        return rank_bytes(stages, layout.dp_shard, largest, FSDP_BLOCKS_WITHOUT_PP, FSDP_BLOCKS_WITHOUT_PP)
    return rank_bytes([sum((u.times(n) for u, n in units), NOTHING)], layout.dp_shard, largest,
                      zero1=precision.zero1)


def stage_bytes(spec: TransformerSpec, layout: ParallelLayout, layers_per_stage: tuple[int, ...], slots: int,
                precision: Precision = FP32, vocab_parallel: bool = True, ep: int = 1) -> list[StateBytes]:
    """Each stage's bytes on the fullest rank (the embedding on the first, the head on the last,
    the dense blocks first in model order)."""
    layer, embedding, head, dense = unit_bytes(spec, layout, slots, precision, vocab_parallel, ep=ep)
    out = [layer.times(n - d) + dense.times(d) for n, d in zip(layers_per_stage, spec.dense_per_stage(layers_per_stage))]
    out[0] = out[0] + embedding
    out[-1] = out[-1] + head
    return out
