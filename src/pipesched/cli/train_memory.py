"""``pipesched train``'s checks of a sharded layout (``--dp-shard``, ``--tp``) against its stages'
parameter shapes, before any rank starts: no rank of a stage left without an element to hold
(:func:`pipesched.layout_refusals.check_stage_shards`), and with ``--memory-limit SIZE`` the bytes
each rank is predicted to hold for its stages' weights, gradients and optimizer state.

The prediction is :func:`pipesched.sharded_bytes.largest_rank_state_bytes`, the one every run's
measured bytes are checked against (the summary's ``predicted_state_bytes``), from the stages'
parameter shapes on the meta device with the model's tensor-parallel plan. A rank holds at most
its sharded parameters, gradients and optimizer state plus, inside a step, each stage's gathered
parameters and its unsharded gradients (held until ``REDUCE_GRAD``): their sum over the rank's
stages is what the limit is checked against. Activations are not in it (they are measured by the
run, as for every layout).
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..errors import ConfigError
from ..layout_refusals import check_stage_shards
from ..memory import format_bytes
from ..parallel_layout import ParallelLayout
from ..schedule import Schedule
from ..sharded_bytes import ParamSpec, StateBytes, largest_rank_state_bytes

# optimizer state tensors per parameter of pipesched train's optimizers (SGD without momentum)
STATE_SLOTS = {"sgd": 0, "adamw": 2}
PARTS = {"params": "sharded parameters", "grads": "sharded gradients", "optimizer": "optimizer state",
         "gathered_params": "gathered parameters", "unsharded_grads": "unsharded gradients"}


def stage_specs(model_def, plan: Schedule, counts: Optional[Sequence[int]], tp: int) -> list[list[ParamSpec]]:
    """Every stage's parameters (each once: a weight tied inside a stage is one parameter) with the
    dim tensor parallelism splits, from blocks built on the meta device."""
    from ..runtime.sharding.tp_plans import param_specs
    from ..runtime.stages.copies import ModelCopies, balanced_block_counts
    from ..runtime.stages.partition import meta_block, stage_block_ranges

    copies = ModelCopies(plan)
    ranges = copies.stage_ranges(stage_block_ranges(model_def.num_blocks, copies.length,
                                                    counts or balanced_block_counts(model_def.block_costs, plan)))
    group = {name: i for i, names in enumerate(model_def.tied) for name in names}
    tp_plan = model_def.tp_plan if tp > 1 else {}
    stages = []
    for blocks in ranges:
        specs, tied_seen = [], set()
        for i in blocks:
            block = meta_block(model_def.build_block, i)
            for (name, _), spec in zip(block.named_parameters(), param_specs(block, tp_plan)):
                tied = group.get(f"{i}.{name}")
                if tied is not None and tied in tied_seen:
                    continue
                tied_seen.add(tied)
                specs.append(spec)
        stages.append(specs)
    return stages


def rank_state(plan: Schedule, stages: list[list[ParamSpec]], layout: ParallelLayout, slots: int, rank: int) -> dict:
    """Bytes by part (:data:`PARTS`) pipeline rank ``rank`` is predicted to hold at most: over its
    stages, each at the tensor-parallel and shard coordinates that hold the most."""
    total = dict.fromkeys(PARTS, 0)
    for s, owner in enumerate(plan.placement):
        if owner == rank:
            state: StateBytes = largest_rank_state_bytes(stages[s], layout, slots)
            for part in PARTS:
                total[part] += getattr(state, part)
    return total


def peak_state(plan: Schedule, stages: list[list[ParamSpec]], layout: ParallelLayout, slots: int) -> tuple[int, dict]:
    """(pipeline rank, bytes by part) of the rank predicted to hold the most inside a step."""
    every = {rank: rank_state(plan, stages, layout, slots, rank) for rank in range(plan.ranks)}
    rank = max(every, key=lambda r: sum(every[r].values()))
    return rank, every[rank]


def check_sharded_stages(model_def, plan: Schedule, counts: Optional[Sequence[int]], dp: int, dp_shard: int, tp: int,
                         optimizer: str, limit: Optional[float]) -> None:
    """Refuse, in one line, a sharded layout under which some rank would hold no element of a
    stage (:func:`pipesched.layout_refusals.check_stage_shards`), or whose predicted weights,
    gradients and optimizer state exceed ``limit`` bytes on some rank (``--memory-limit``)."""
    layout = ParallelLayout(plan.ranks, dp, dp_shard, tp)
    stages = stage_specs(model_def, plan, counts, tp)
    check_stage_shards(layout, stages)
    if limit is None:
        return
    rank, parts = peak_state(plan, stages, layout, STATE_SLOTS[optimizer])
    total = sum(parts.values())
    if total <= limit:
        return
    part = max(parts, key=parts.get)
    raise ConfigError(
        f"--memory-limit {format_bytes(limit)}: --ranks {plan.ranks} x --dp-shard {dp_shard} x --tp {tp} holds up to "
        f"{format_bytes(total)} per rank (pipeline rank {rank}) before any activation, the largest part "
        f"{PARTS[part]} ({format_bytes(parts[part])}): use a larger --dp-shard or --tp, more --ranks, or a larger limit"
    )
