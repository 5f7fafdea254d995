"""Where each stage lives: the loop (interleaved) and V placements.

With ``p`` ranks and ``v`` chunks per rank there are ``p*v`` stages. ``loop`` puts stage ``s`` on
rank ``s % p`` (Megatron's interleaving); ``v`` (two chunks) sends the model down the ranks and
back up, so rank ``r`` holds stages ``r`` and ``2p-1-r`` and the first and last stage share rank 0.
"""

from __future__ import annotations

from .errors import ConfigError


def loop_placement(ranks: int, chunks: int = 1) -> tuple[int, ...]:
    """Stage ``s`` on rank ``s % ranks`` for ``ranks * chunks`` stages."""
    return tuple(s % ranks for s in range(ranks * chunks))


def v_placement(ranks: int) -> tuple[int, ...]:
    """Two chunks per rank in a V: stage ``r`` and stage ``2*ranks-1-r`` on rank ``r``."""
    return tuple(s if s < ranks else 2 * ranks - 1 - s for s in range(2 * ranks))


def placement_style(placement: tuple[int, ...], ranks: int) -> str:
    """``"loop"``, ``"v"`` or ``"custom"`` for a stage-to-rank map."""
    stages = len(placement)
    if stages % ranks == 0 and placement == loop_placement(ranks, stages // ranks):
        return "loop"
    if stages == 2 * ranks and placement == v_placement(ranks):
        return "v"
    return "custom"


def stages_by_rank(placement: tuple[int, ...], ranks: int) -> list[list[int]]:
    """For each rank, the stages it holds, in model order."""
    held: list[list[int]] = [[] for _ in range(ranks)]
    for stage, rank in enumerate(placement):
        if not 0 <= rank < ranks:
            raise ConfigError(f"stage {stage} is placed on rank {rank}, but ranks are 0..{ranks - 1}")
        held[rank].append(stage)
    return held
