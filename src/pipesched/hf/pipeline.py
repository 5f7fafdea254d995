"""``pipeline(model, schedule, ...)``: a Hugging Face causal LM trained by any schedule, under its own names.

The runtime (:class:`~pipesched.runtime.PipelineRuntime`) runs the model's blocks
(:mod:`.blocks`); :class:`HFPipeline` speaks to it as the model is spoken to: ``step(batch)``
takes ``{"input_ids", "labels", "attention_mask"?}`` (the same on every rank), returns the
step's result whose ``loss`` is the loss Hugging Face computes on the whole batch
(:mod:`.loss`); parameters, gradients and state dicts carry the model's names
(``model.layers.3.mlp.up_proj.weight``), so what is gathered loads ``strict=True`` into the
model and what is checkpointed resumes under any schedule and rank count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from ..errors import ConfigError
from ..parallel_layout import ParallelLayout
from ..schedule import Schedule
from ..training.launch_checks import check_batch_split, check_sharded_stages, check_world
from ..training.model_def import ModelDef
from .build import BlockSource
from .loss import StepNormalisedLoss
from .randomness import KEY, step_key
from .split import block_costs, deferred_weight_grad_share, stage_block_counts

Batch = Mapping[str, torch.Tensor]
_BATCH_KEYS = ("input_ids", "labels", "attention_mask", "position_ids")


def model_name(runtime_name: str) -> str:
    """``"4.model.layers.3.mlp.up_proj.weight"`` (block 4) -> the model's own name."""
    return runtime_name.partition(".")[2]


def max_positions(config) -> Optional[int]:
    return getattr(config, "max_position_embeddings", None)


def check_batch(batch: Batch, config) -> None:
    """Refuse (one line) a batch the model cannot take: missing keys, shapes that differ, too long."""
    unknown = sorted(set(batch) - set(_BATCH_KEYS))
    if unknown or "input_ids" not in batch or "labels" not in batch:
        raise ConfigError(f"a batch is a dict of input_ids, labels and optionally attention_mask, position_ids; "
                          f"got {sorted(batch)}")
    shape = tuple(batch["input_ids"].shape)
    for key, value in batch.items():
        if tuple(value.shape) != shape:
            raise ConfigError(f"the batch's {key} is {list(value.shape)}, its input_ids {list(shape)}")
    limit = max_positions(config)
    if limit is not None and shape[1] > limit:
        raise ConfigError(f"a sequence of {shape[1]} tokens is longer than the model's {limit} positions "
                          "(max_position_embeddings)")


class HFPipeline:
    """A Hugging Face causal LM pipelined over this rank's stages (build it with :func:`pipeline`)."""

    def __init__(self, runtime, source: BlockSource, loss: StepNormalisedLoss, seed: int) -> None:
        self.runtime = runtime
        self.source = source
        self.config = source.config
        self.loss = loss
        self.seed = seed

    @property
    def steps_done(self) -> int:
        return self.runtime.steps_done

    def step(self, batch: Batch):
        """One training step on the global ``batch`` (given the same on every rank); returns the
        runtime's :class:`~pipesched.runtime.StepResult`, whose ``loss`` is the model's loss on it.
        Dropout and router noise draw keyed by (seed, step, microbatch, block): :mod:`.randomness`."""
        check_batch(batch, self.config)
        self.loss.start_step(batch["labels"])
        context = step_context(batch, self.seed, self.steps_done)
        return self.runtime.step(batch["input_ids"], batch["labels"], context=context)

    def named_parameters(self) -> Iterable[tuple[str, nn.Parameter]]:
        """This rank's parameters under the model's names."""
        for name, param in self.runtime.named_parameters():
            yield model_name(name), param

    def gather_state_dict(self, dst: int = 0) -> Optional[dict[str, torch.Tensor]]:
        """The whole model's state dict on rank ``dst`` (None elsewhere), under the model's names:
        it loads ``strict=True`` into the model."""
        return _renamed(self.runtime.gather_state_dict(dst))

    def gather_gradients(self, dst: int = 0) -> Optional[dict[str, torch.Tensor]]:
        """The last step's gradients of the whole model on rank ``dst``, under the model's names."""
        return _renamed(self.runtime.gather_gradients(dst))

    def model_module(self) -> nn.Module:
        """What a checkpoint holds of this rank: its parameters and buffers under the model's
        names, a tied weight once, under its group's first name (``transformer.wte.weight``) on
        every rank that holds a copy, so a checkpoint of any placement loads into any other
        (:func:`pipesched.runtime.checkpoints.checkpoint_names.tied_view`)."""
        return self.runtime.checkpoint_module(model_name)

    def deferred_weight_grad_share(self) -> float:
        """What share of this rank's weight-gradient work the split backward defers (0 without it)."""
        if not self.runtime.schedule.split_backward:
            return 0.0
        return deferred_weight_grad_share(self.runtime.stages.values(), self.config)


def _renamed(state: Optional[dict]) -> Optional[dict]:
    if state is None:
        return None
    return {model_name(k): v for k, v in state.items()}


def tied_groups(source: BlockSource) -> tuple[tuple[str, ...], ...]:
    """The model's tied weights (GPT-2's ``transformer.wte.weight`` and ``lm_head.weight``) as the
    runtime names them, behind the index of the block holding each (none unless the config ties)."""
    model = source.skeleton
    tied = model.get_expanded_tied_weights_keys() if source.config.tie_word_embeddings else {}
    block_of = {name: i for i in range(source.num_blocks) for name in source.meta_block(i).state_dict()}
    groups: dict[str, list[str]] = {}
    for copy, original in tied.items():  # the original's value is the group's (first name)
        groups.setdefault(original, [original]).append(copy)
    return tuple(tuple(f"{block_of[n]}.{n}" for n in names) for names in groups.values())


def head_counts(config) -> tuple[int, ...]:
    """The head counts (attention, key-value) tensor parallelism must divide, as the config names them."""
    names = ("num_attention_heads", "num_key_value_heads", "num_kv_heads")
    return tuple(h for h in (getattr(config, name, None) for name in names) if h)


def launch_model(source: BlockSource, sample_batch: Batch, tp_plan: Optional[dict], costs: Sequence[float]) -> ModelDef:
    """The model as the checks before launch see it (:mod:`pipesched.training.launch_checks`, the
    ones ``pipesched train`` makes): its blocks, tied weights, plan and heads, and ``sample_batch``,
    from whose shapes and masks its activations are predicted."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    config = source.config
    side = {k: sample_batch[k] for k in ("attention_mask", "position_ids") if k in sample_batch}
    return ModelDef(type(source.skeleton).__name__, source.num_blocks, source,
                    lambda logits, labels: ForCausalLMLoss(logits, labels, config.vocab_size),
                    lambda step, size, seed: (sample_batch["input_ids"], sample_batch["labels"]), tuple(costs),
                    tied_groups(source), tp_plan=tp_plan, heads=head_counts(config),
                    context=(lambda ids: side) if side else None)


def step_context(batch: Batch, seed: int, step: int) -> dict:
    """What every block reads of the batch: the masks' and positions' inputs (causal over
    0..S-1 without them) and the key of its draws (:mod:`.randomness`)."""
    context = {k: batch[k] for k in ("attention_mask", "position_ids") if k in batch}
    context[KEY] = step_key(batch["input_ids"].shape[0], seed, step)
    return context


def pipeline(
    model,
    schedule: Schedule,
    *,
    optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
    sample_batch: Batch,
    seed: int = 0,
    mesh=None,
    weights: Union[str, Path, None] = None,
    layers_per_stage: Optional[Sequence[int]] = None,
    options=None,
    tp_plan: Optional[dict] = None,
    rank_memory_limit: Optional[float] = None,
) -> HFPipeline:
    """Pipeline a ``*ForCausalLM`` (built the same way on every rank; each rank then keeps only
    its stages' modules) or a transformers config (each rank materialises only its own modules,
    initialised as the model initialises them, or read by name from the safetensors in
    ``weights``) with ``schedule``. Call on every rank with the same arguments.

    ``sample_batch``: a batch as :meth:`HFPipeline.step` takes it (only its shapes are used).
    ``layers_per_stage`` (one count per stage of one model copy) overrides the balanced split.
    ``options``: the runtime's :class:`~pipesched.runtime.options.RuntimeOptions` (``device``,
    ``timeout_s``, ``clip_grad_norm``, ``recompute``, ``dtype``, ...); its seed is set here, and the
    model's facts (block counts, tied groups, sample context) are the
    :class:`~pipesched.runtime.stages.staged_model.StagedModel` built here. ``mesh``: a
    :class:`~pipesched.runtime.comm.mesh.PipelineMesh` (replicas), or a
    :class:`~pipesched.runtime.sharding.sharded_mesh.ShardedMesh` (FSDP and tensor parallelism inside the
    stages; the family's tensor-parallel plan is taken unless ``tp_plan`` gives one); either made with
    ``ep`` above 1 splits each MoE layer's routed experts over its data-parallel ranks (docs/expert-parallel.md).
    ``rank_memory_limit``: the bytes a rank of a sharded layout may hold (weights, gradients,
    optimizer state and activations, as predicted before any step).

    The mesh's world (under torchrun), the batch split and a sharded layout are checked as
    ``pipesched train`` checks them, refused in the same words (:mod:`pipesched.training.launch_checks`).
    """
    from dataclasses import replace

    from ..expert_plans import check_ep, expert_plan_for
    from ..runtime.comm.mesh import PipelineMesh
    from ..runtime.executor import PipelineRuntime
    from ..runtime.options import RuntimeOptions
    from ..runtime.sharding.sharded_mesh import ShardedMesh
    from ..runtime.stages.staged_model import StagedModel
    from .splitting import prepare_split_backward

    source = BlockSource(model, weights)
    config = source.config
    check_batch(sample_batch, config)
    sharded = isinstance(mesh, ShardedMesh)
    if mesh is not None:  # torchrun started the mesh's processes (the whole world's own mesh fits any)
        check_world(mesh.layout if sharded else ParallelLayout(mesh.pp, mesh.dp))
    replicas = (mesh.pipeline if sharded else mesh or PipelineMesh.whole_world()).dp
    family, experts = type(source.skeleton).__name__, getattr(mesh.pipeline if sharded else mesh, "experts", None)
    if experts is not None:
        check_ep(family, config, experts.ep, replicas)
    shares = schedule.microbatches * replicas
    ids = sample_batch["input_ids"]
    check_batch_split(ids.shape[0], replicas, schedule.microbatches)
    blocks = [source.meta_block(i) for i in range(source.num_blocks)]
    costs = block_costs(blocks, config, ids.shape[1])
    counts = stage_block_counts(schedule, costs, layers_per_stage)
    loss = StepNormalisedLoss(config.vocab_size, schedule.microbatches, replicas)
    context = step_context(sample_batch, seed, 0)
    one = ids.shape[0] // shares
    options = replace(options or RuntimeOptions(), seed=seed)
    prepare_split_backward()  # before the checks: GPT-2's Conv1D is a Linear to the tp styles
    if sharded:
        if tp_plan is None and options.tp_plan is None:  # (RuntimeOptions' tp_plan: deprecated)
            tp_plan = _family_plan(source, config, mesh.layout.tp)
        check_sharded_stages(launch_model(source, sample_batch, tp_plan or options.tp_plan, costs), schedule, counts,
                             mesh.layout, optimizer, rank_memory_limit, batch_size=ids.shape[0],
                             seed=seed, recompute=options.recompute, dtype=options.dtype)
    elif rank_memory_limit is not None:
        raise ConfigError("rank_memory_limit goes with a ShardedMesh (dp_shard or tp): a whole stage's memory is not predicted")
    staged = StagedModel(source, source.num_blocks, ids[:one], block_counts=counts, tied=tied_groups(source),
                         sample_context={k: v[:one] for k, v in context.items()}, tp_plan=tp_plan,
                         expert_plan=expert_plan_for(family, config))
    runtime = PipelineRuntime(staged, schedule, loss, optimizer, options=options, mesh=mesh)
    source.release_others()
    return HFPipeline(runtime, source, loss, seed)


def _family_plan(source: BlockSource, config, tp: int) -> Optional[dict]:
    """The family's tensor-parallel plan (its config's, with pipesched's overrides); under ``tp`` above
    1 a family without one is refused, saying why (no plan declared, or styles pipesched cannot apply)."""
    from ..runtime.sharding.model_plans import plan_for, untranslated

    family = type(source.skeleton).__name__
    plan = plan_for(family, config)
    if plan is None and tp > 1:
        lacking = untranslated(family, config)
        why = (f"its config's base_model_tp_plan has styles pipesched cannot apply ({lacking})" if lacking
               else "its config declares none")
        raise ConfigError(f"tensor parallelism (tp={tp}): {family} has no tensor-parallel plan: {why} "
                          "(docs/layouts.md says which plans apply, and why): give tp_plan, or leave tp at 1")
    return plan
