"""The checks before any rank starts that ``pipesched train`` and :func:`pipesched.hf.pipeline`
both make, so the Python API refuses what the command line refuses, in the same words: a torchrun
world other than the layout's (:func:`check_world`), a batch that does not split into the
microbatches (a checkpoint of another model or optimizer to resume from: the checks of
:mod:`pipesched.training.checkpoint_checks`), a layout's
``tp`` that the model has no plan for or that does not divide its heads, a rank of a stage left
without an element to hold (:func:`pipesched.layout_refusals.check_stage_shards`), and with a rank
memory limit (``--rank-memory-limit``, ``rank_memory_limit=``) the bytes each rank is predicted to
hold for its stages' weights, gradients, optimizer state and activations.

The state prediction is :func:`pipesched.sharded_bytes.largest_rank_state_bytes`, the one every
run's measured bytes are checked against (the summary's ``predicted_state_bytes``), from the stages'
parameter shapes on the meta device with the model's tensor-parallel plan. A rank holds at most
its sharded parameters, gradients and optimizer state plus, inside a step, each stage's gathered
parameters and its unsharded gradients (held until ``REDUCE_GRAD``). The activation prediction is
the runtime's own, from the sizes it would measure on its first step, measured here on fake
tensors (:mod:`pipesched.runtime.engine.sizes_ahead`): the summary's
``predicted_peak_activation_bytes``, to the byte, for the gpt and Hugging Face models alike (whose
blocks build their masks from the batch's real values, :mod:`pipesched.hf.blocks`), and under
``--tp`` too: each stage parallelised by the model's plan on a fake mesh in this process
(:mod:`pipesched.runtime.sharding.fake_mesh`, gone before any rank starts). Their sum per rank is
what the limit is checked against (mixtures of experts too: :mod:`pipesched.runtime.engine.fake_kernels`).
A model whose layers fail on fake tensors (experts in transformers' eager loop, which picks each
expert's tokens by value) has no activations predicted, and the refusal says its figure holds none.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Mapping, Optional, Sequence

from ..environment import torchrun_rank
from ..errors import ConfigError
from ..layout_refusals import check_stage_shards
from ..memory import format_bytes
from ..parallel_layout import ParallelLayout
from ..schedule import Schedule
from ..sharded_bytes import ParamSpec, StateBytes, largest_rank_state_bytes

PARTS = {"params": "sharded parameters", "grads": "sharded gradients", "optimizer": "optimizer state",
         "gathered_params": "gathered parameters", "unsharded_grads": "unsharded gradients"}


def state_slots(optimizer: Callable) -> int:
    """The optimizer state tensors per parameter that the optimizer factory ``optimizer`` keeps
    (SGD without momentum none, AdamW two), counted on a one-element parameter after one step:
    what the optimizer holds, not a table of names."""
    import torch

    param = torch.nn.Parameter(torch.zeros(2))
    param.grad = torch.zeros(2)
    made = optimizer([param])
    made.step()
    return sum(1 for value in made.state[param].values() if torch.is_tensor(value) and value.shape == param.shape)


def check_batch_split(batch_size: int, dp: int, microbatches: int) -> None:
    """Raise ConfigError unless ``batch_size`` splits into ``dp`` shares (replicas x shards: a
    shard's ranks are no replicas, so the message names both flags) of ``microbatches`` equal
    microbatches."""
    m = microbatches
    if batch_size % (dp * m):
        raise ConfigError(f"a batch of {batch_size} does not split into {m} equal microbatches"
                          + (f" on each of its {dp} data-parallel shares (--dp x --dp-shard)" if dp > 1 else "")
                          + f": use a multiple of {dp * m}")


def layout_named(layout: ParallelLayout) -> str:
    """``layout`` as a refusal names it to the Python API (``train`` names its flags instead)."""
    return " x ".join(f"{name}={size}" for name, size in (("ranks", layout.pp), ("dp", layout.dp_replicate),
                                                            ("dp_shard", layout.dp_shard), ("tp", layout.tp)))


def check_world(layout: ParallelLayout, named: Optional[str] = None, environ: Mapping[str, str] = os.environ) -> None:
    """Refuse, before any work, a torchrun launch of other than ``layout``'s ``pp x dp x dp_shard x
    tp`` processes (``named``: the layout as the caller's user wrote it; default :func:`layout_named`)."""
    launched = torchrun_rank(environ)
    if launched is not None and launched.world != layout.world:
        raise ConfigError(f"torchrun started {launched.world} processes but {named or layout_named(layout)} needs "
                          f"{layout.world}: use --nproc-per-node x --nnodes = {layout.world}")


def check_tp(model_def, tp: int) -> None:
    """A model ``tp`` cannot split: it has no tensor-parallel plan, or its plan splits the attention
    (:func:`~pipesched.runtime.sharding.tp_plans.splits_attention`) and ``tp`` does not divide its heads."""
    from ..runtime.sharding.tp_plans import splits_attention

    if tp == 1:
        return
    if model_def.tp_plan is None:
        raise ConfigError(f"tp={tp}: {model_def.name} has no tensor-parallel plan (docs/layouts.md lists the models "
                          "that have one, and why the others have none)")
    for heads in model_def.heads if splits_attention(model_def.tp_plan) else ():
        if heads % tp:
            raise ConfigError(f"tp={tp} does not divide the {heads} attention heads of {model_def.name}")


def check_experts(model_def, plan: Optional[Schedule], layout: ParallelLayout) -> None:
    """Refuse, in one line, an ``ep`` the model or the run cannot take: a dense model, a family whose
    router pipesched does not know, ``ep`` not dividing the experts or the data-parallel ranks
    (:func:`pipesched.expert_plans.check_ep`), a schedule of two model copies
    (DualPipe's: their experts' gradients would be summed across copies; ``plan`` None: not known
    yet). Checkpoints hold every expert under its global index: any EP degree resumes them
    (:mod:`pipesched.runtime.checkpoints.checkpoint_pieces`)."""
    if layout.ep == 1:
        return
    if model_def.ep_check is None:
        raise ConfigError(f"--ep {layout.ep}: {model_def.name} is a dense model, it has no routed experts to split")
    model_def.ep_check(layout.ep, layout.dp)
    if plan is not None and plan.pipelines > 1:
        raise ConfigError(f"--ep {layout.ep}: expert parallelism runs schedules of one model copy, not "
                          f"{plan.name}'s {plan.pipelines}")


def stage_specs(model_def, plan: Schedule, counts: Optional[Sequence[int]], tp: int,
                ep: int = 1) -> list[list[ParamSpec]]:
    """Every stage's parameters (each once: a weight tied inside a stage is one parameter) with the
    dim tensor parallelism splits (and under ``ep`` which are routed experts), from blocks built
    on the meta device; ConfigError when ``tp`` does not divide a dim it splits
    (:func:`_check_tp_split`)."""
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
            specs_here = param_specs(block, tp_plan, model_def.expert_plan if ep > 1 else None)
            for (name, _), spec in zip(block.named_parameters(), specs_here):
                _check_tp_split(spec, tp, model_def.checkpoint_name(f"{i}.{name}"))
                tied = group.get(f"{i}.{name}")
                if tied is not None and tied in tied_seen:
                    continue
                tied_seen.add(tied)
                specs.append(spec)
        stages.append(specs)
    return stages


def _check_tp_split(spec: ParamSpec, tp: int, name: str) -> None:
    """Refuse a parameter whose dim tensor parallelism splits is not a multiple of ``tp`` (an MLP's
    ``intermediate_size`` of 37 under ``tp=2``): DTensor would cut it unevenly and the ranks' matrix
    products would fail at step 1."""
    if spec.tp_dim is None or spec.shape[spec.tp_dim] % tp == 0:
        return
    size = spec.shape[spec.tp_dim]
    raise ConfigError(f"tp={tp} does not divide the {size} {'rows' if spec.tp_dim == 0 else 'columns'} of {name} "
                      f"(shape {list(spec.shape)}), which tensor parallelism splits: use a --tp that divides {size}")


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
                     seed: int, recompute, dtype, tp: int = 1) -> list[float]:
    """Each pipeline rank's peak activation bytes, as the run will predict them from its first
    step's sizes, the largest over its microbatches (:mod:`pipesched.runtime.engine.sizes_ahead`):
    the first batch cut into microbatches as the runtime cuts it (``data_ranks`` shards of
    ``batch_size``, each in the schedule's microbatches: views of the batch, as the runtime's), one
    of each kind the model tells apart (``ModelDef.sizes_key``: a Hugging Face model's packed
    documents, whose explicit mask attention saves) predicted, the largest sizes kept
    (:func:`~pipesched.runtime.metering.observers.largest_sizes`); ``recompute``: the run's setting
    (``RuntimeOptions.recompute``); at ``tp > 1`` each stage parallelised by the model's plan on a
    fake mesh of ``tp`` ranks (:mod:`pipesched.runtime.sharding.fake_mesh`), a ``tp`` rank's pieces."""
    from contextlib import nullcontext

    from ..memory import recompute_stages
    from ..runtime.engine.sizes_ahead import rank_peaks_ahead, stage_sizes_ahead
    from ..runtime.metering.observers import largest_sizes
    from ..runtime.sharding.fake_mesh import fake_tp_mesh
    from ..runtime.sharding.tp_plans import apply_tp
    from ..runtime.stages.copies import balanced_block_counts

    x, y = model_def.batch(0, batch_size, seed)
    size = batch_size // (data_ranks * plan.microbatches)
    with fake_tp_mesh(tp) if tp > 1 else nullcontext() as mesh:
        learned = [stage_sizes_ahead(
            model_def.build_block, model_def.num_blocks, plan, model_def.loss_fn, (x[piece], y[piece]),
            counts=counts or balanced_block_counts(model_def.block_costs, plan),
            recompute=recompute_stages(recompute, plan), dtype=dtype, context=context,
            shard=None if mesh is None else lambda stage: apply_tp(stage, model_def.tp_plan, mesh))
            for piece, context in _microbatch_kinds(model_def, x, size)]
    return rank_peaks_ahead(plan, largest_sizes(learned))


def _microbatch_kinds(model_def, x, size: int) -> list[tuple[slice, Optional[dict]]]:
    """The first microbatch of each kind in the batch ``x`` (cut into microbatches of ``size``) and
    its batch context: kinds told apart by ``ModelDef.sizes_key``, else by the context's values
    (a model without a context: one kind)."""
    context = model_def.batch_context(x)
    if context is None:
        return [(slice(0, size), None)]
    kinds: dict = {}
    for start in range(0, len(x), size):
        piece = slice(start, start + size)
        part = {k: t[piece] for k, t in context.items()}
        key = (model_def.sizes_key(part) if model_def.sizes_key is not None
               else tuple(t.numpy().tobytes() for t in part.values()))
        kinds.setdefault(key, (piece, part))
    return list(kinds.values())


def _predicted_activations(model_def, plan: Schedule, counts: Optional[Sequence[int]], batch_size: int,
                           data_ranks: int, seed: int, recompute, dtype, tp: int) -> tuple[list[float], Optional[str]]:
    """:func:`activation_peaks`, or zeros and why not: a model whose layers cannot run on fake
    tensors (code that reads a tensor's values, a kernel whose fake implementation refuses what
    the CPU runs) is left unpredicted, and its refusal says so."""
    import logging

    import torch

    fake_log = logging.getLogger("torch._subclasses.fake_tensor")  # logs each failing op's traceback
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        return activation_peaks(model_def, plan, counts, batch_size, data_ranks, seed, recompute,
                                dtype or torch.float32, tp), None
    except RuntimeError as err:  # torch's data-dependent and unsupported-operator errors on fake tensors
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return [0.0] * plan.ranks, f"for {model_def.name}, which fails on fake tensors: {first[:120]}"
    finally:
        fake_log.setLevel(level)


def check_sharded_stages(model_def, plan: Schedule, counts: Optional[Sequence[int]], layout: ParallelLayout,
                         optimizer: Callable, limit: Optional[float], *, batch_size: int, seed: int, recompute=None,
                         dtype=None) -> None:
    """Refuse, in one line, a sharded layout whose ``tp`` the model cannot take (:func:`check_tp`),
    under which some rank would hold no element of a stage
    (:func:`pipesched.layout_refusals.check_stage_shards`), or whose predicted weights, gradients,
    optimizer state (as many tensors per parameter as the factory ``optimizer`` keeps:
    :func:`state_slots`, counted only when there is a ``limit``) and activations (where predicted:
    :func:`_predicted_activations`) exceed ``limit`` bytes on some rank."""
    check_tp(model_def, layout.tp)
    stages = stage_specs(model_def, plan, counts, layout.tp, layout.ep)
    check_stage_shards(layout, stages)
    if limit is None:
        return
    slots = state_slots(optimizer)
    held = [rank_state(plan, stages, layout, slots, rank) for rank in range(plan.ranks)]
    activations, unpredicted = _predicted_activations(model_def, plan, counts, batch_size, layout.dp, seed,
                                                      recompute, dtype, layout.tp)
    rank = max(range(plan.ranks), key=lambda r: sum(held[r].values()) + activations[r])
    parts = held[rank]
    total = sum(parts.values()) + activations[rank]
    if total <= limit:
        if unpredicted is not None:
            print(f"pipesched: warning: the rank memory limit counted no activations (not predicted {unpredicted})",
                  file=sys.stderr)
        return
    part = max(parts, key=parts.get)
    counted = (f"with {format_bytes(activations[rank])} of activations at the schedule's peak" if unpredicted is None
               else f"before any activation (not predicted {unpredicted})")
    raise ConfigError(
        f"a rank memory limit of {format_bytes(limit)}: ranks={plan.ranks} x dp_shard={layout.dp_shard} x tp={layout.tp} "
        f"holds up to {format_bytes(total)} per rank (pipeline rank {rank}) {counted}, the largest part of its state "
        f"{PARTS[part]} ({format_bytes(parts[part])}): use a larger dp_shard or tp, more ranks, or a larger limit"
    )
