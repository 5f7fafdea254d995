"""A transformer's bytes per rank under a layout: :mod:`pipesched.sharded_bytes`'s rules applied to
the shapes a transformer of given sizes has (:meth:`~.transformer.TransformerSpec.layer_specs`).

Every block of a transformer has the same shapes, so a rank's bytes are those of one block times
its blocks, plus the embedding and the head where it holds them: each of the three counted once
per layout (:func:`unit_bytes`, kept); and a search asks for the same few ranks (a count of
blocks, with or without an end) again and again, so each rank's bytes are kept too: ``advise
--gpus 512`` asks about a hundred thousand times.
"""

from __future__ import annotations

from functools import lru_cache

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
               vocab_parallel: bool = True, tp_rank: int = 0, shard_rank: int = 0) -> tuple[StateBytes, ...]:
    """(one block, the embedding, the head) on the rank at (``tp_rank``, ``shard_rank``) of
    ``layout``; the default coordinates are the fullest rank's."""
    return tuple(rank_state_bytes(specs, layout, tp_rank, shard_rank, slots, precision)
                 for specs in (spec.layer_specs(), spec.embedding_specs(vocab_parallel),
                               spec.head_specs(vocab_parallel)))


@lru_cache(maxsize=4096)
def transformer_rank_bytes(spec: TransformerSpec, layout: ParallelLayout, layers: int, first: bool, last: bool,
                           slots: int, precision: Precision = FP32, vocab_parallel: bool = True,
                           tp_rank: int = 0, shard_rank: int = 0) -> RankBytes:
    """One rank holding ``layers`` blocks, the embedding if ``first``, the head if ``last``.

    With a pipeline (``layout.pp > 1``) every local stage stays gathered from its first forward to
    its last backward (torchtitan's ``reshard_after_forward=False`` under PP): the rank's stages
    count as one. Without one, FSDP reshards each block after its forward and reduce-scatters
    after its backward, so :data:`FSDP_BLOCKS_WITHOUT_PP` units are gathered and unsharded at once."""
    layer, embedding, head = unit_bytes(spec, layout, slots, precision, vocab_parallel, tp_rank, shard_rank)
    units = [(layer, layers), (embedding, int(first)), (head, int(last))]
    largest = max((u for u, n in units if n), key=lambda u: u.gathered_params, default=NOTHING)
    if layout.pp == 1 and layout.dp_shard > 1:
        stages = [u for u, n in units for _ in range(n)]
        return rank_bytes(stages, layout.dp_shard, largest, FSDP_BLOCKS_WITHOUT_PP, FSDP_BLOCKS_WITHOUT_PP)
    return rank_bytes([sum((u.times(n) for u, n in units), NOTHING)], layout.dp_shard, largest)


def stage_bytes(spec: TransformerSpec, layout: ParallelLayout, layers_per_stage: tuple[int, ...], slots: int,
                precision: Precision = FP32, vocab_parallel: bool = True) -> list[StateBytes]:
    """Each stage's bytes on the fullest rank (the embedding on the first, the head on the last)."""
    layer, embedding, head = unit_bytes(spec, layout, slots, precision, vocab_parallel)
    out = [layer.times(n) for n in layers_per_stage]
    out[0] = out[0] + embedding
    out[-1] = out[-1] + head
    return out
