"""``pipesched train``'s checks of a sharded layout (``--dp-shard``, ``--tp``) against its stages'
parameter shapes, before any rank starts: no rank of a stage left without an element to hold
(:func:`pipesched.layout_refusals.check_stage_shards`), and with ``--memory-limit SIZE`` the bytes
each rank is predicted to hold for its stages' weights, gradients, optimizer state and activations.

The state prediction is :func:`pipesched.sharded_bytes.largest_rank_state_bytes`, the one every
run's measured bytes are checked against (the summary's ``predicted_state_bytes``), from the stages'
parameter shapes on the meta device with the model's tensor-parallel plan. A rank holds at most
its sharded parameters, gradients and optimizer state plus, inside a step, each stage's gathered
parameters and its unsharded gradients (held until ``REDUCE_GRAD``). The activation prediction is
the runtime's own, from the sizes it would measure on its first step, measured here on fake
tensors (:mod:`pipesched.runtime.engine.sizes_ahead`): the summary's
``predicted_peak_activation_bytes``. Their sum per rank is what the limit is checked against.
Under ``--tp``, and for Hugging Face models (whose fake run takes transformers' tracing path and
saves more than the real one), the activations are not predicted, and the refusal says that its
figure holds none.
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


def activation_peaks(model_def, plan: Schedule, counts: Optional[Sequence[int]], batch_size: int, data_ranks: int,
                     seed: int, recompute, dtype) -> list[float]:
    """Each pipeline rank's peak activation bytes, as the run will predict them from its first
    step's sizes (:mod:`pipesched.runtime.engine.sizes_ahead`): its first microbatch cut from the
    first batch as the runtime cuts it (``data_ranks`` shards of ``batch_size``, each in the
    schedule's microbatches: a view of the batch, as the runtime's); ``recompute``: the run's
    setting (``RuntimeOptions.recompute``)."""
    from ..memory import recompute_stages
    from ..runtime.engine.sizes_ahead import rank_peaks_ahead, stage_sizes_ahead
    from ..runtime.stages.copies import balanced_block_counts

    x, y = model_def.batch(0, batch_size, seed)
    context = model_def.batch_context(x)
    size = batch_size // (data_ranks * plan.microbatches)
    sizes = stage_sizes_ahead(model_def.build_block, model_def.num_blocks, plan, model_def.loss_fn, (x[:size], y[:size]),
                              counts=counts or balanced_block_counts(model_def.block_costs, plan),
                              recompute=recompute_stages(recompute, plan), dtype=dtype,
                              context=None if context is None else {k: t[:size] for k, t in context.items()})
    return rank_peaks_ahead(plan, sizes)


def _activations_unpredicted(model_def, tp: int) -> Optional[str]:
    """Why the activations of this run are not predicted before launch, or None where they are:
    a tensor-parallel stage needs its process group; on fake tensors transformers takes its
    tracing path (an explicit causal mask, keys and values repeated per head), which saves more
    than the real run (a tiny Llama's middle stages: 2 KiB more per 16-token microbatch), so a
    Hugging Face model's figure would not be the run's."""
    if tp > 1:
        return "under --tp: a tensor-parallel stage needs its process group"
    if model_def.name.startswith("hf:"):
        return "for Hugging Face models yet"
    return None


def check_sharded_stages(model_def, plan: Schedule, counts: Optional[Sequence[int]], dp: int, dp_shard: int, tp: int,
                         optimizer: str, limit: Optional[float], *, batch_size: int, seed: int, recompute=None,
                         dtype=None) -> None:
    """Refuse, in one line, a sharded layout under which some rank would hold no element of a
    stage (:func:`pipesched.layout_refusals.check_stage_shards`), or whose predicted weights,
    gradients, optimizer state and activations (where predicted: :func:`_activations_unpredicted`)
    exceed ``limit`` bytes on some rank (``--memory-limit``)."""
    layout = ParallelLayout(plan.ranks, dp, dp_shard, tp)
    stages = stage_specs(model_def, plan, counts, tp)
    check_stage_shards(layout, stages)
    if limit is None:
        return
    slots = STATE_SLOTS[optimizer]
    held = [rank_state(plan, stages, layout, slots, rank) for rank in range(plan.ranks)]
    unpredicted = _activations_unpredicted(model_def, tp)
    if unpredicted is None:
        import torch

        activations = activation_peaks(model_def, plan, counts, batch_size, dp * dp_shard, seed, recompute,
                                       dtype or torch.float32)
    else:
        activations = [0.0] * plan.ranks
    rank = max(range(plan.ranks), key=lambda r: sum(held[r].values()) + activations[r])
    parts = held[rank]
    total = sum(parts.values()) + activations[rank]
    if total <= limit:
        return
    part = max(parts, key=parts.get)
    counted = (f"with {format_bytes(activations[rank])} of activations at the schedule's peak" if unpredicted is None
               else f"before any activation (not predicted {unpredicted})")
    raise ConfigError(
        f"--memory-limit {format_bytes(limit)}: --ranks {plan.ranks} x --dp-shard {dp_shard} x --tp {tp} holds up to "
        f"{format_bytes(total)} per rank (pipeline rank {rank}) {counted}, the largest part of its state "
        f"{PARTS[part]} ({format_bytes(parts[part])}): use a larger --dp-shard or --tp, more --ranks, or a larger limit"
    )
