"""PipelineRuntime: one rank's stages, prepared once, and the step protocol that trains them.

Training semantics equal the unpipelined model's: the batch is split into ``m`` microbatches
along dim 0, each microbatch's loss is scaled by ``1/m`` before its backward, gradients
accumulate over the step, and each rank steps its optimizer once per step, after its last
action and after the step's loss is known to be finite on every rank; a step that leaves a
parameter non-finite stops every rank.

**Prepare** (the constructor): choose the stages' strategy, whole or sharded, from the mesh
(:mod:`.strategy`: everything the two differ in, asked of it, no mode tested here), infer the
boundary shapes (before any block is prepared), build this rank's stages, tie shared parameters,
route Linears through the split backward, lay the stages out, make the optimizer, the links and
the reduction plan, broadcast tied weights, open the links.

**A step**, in named phases, one method each: :meth:`~PipelineRuntime._prepare` (split the batch,
its context and targets; shapes changed?), :meth:`~PipelineRuntime._run_program` (the engine,
:mod:`.engine`, whose :class:`~.stage_runner.StageRunner` per owned stage computes), then
finish the reductions (:mod:`.reduction`) and :meth:`~PipelineRuntime._agree` on the loss
(:mod:`.agree`), :meth:`~PipelineRuntime._update` (clip, optimizer, guard), result. Observers
(:mod:`.observers`) learn the stage sizes and time the actions without living in the loop. The
step count changes only here and through :meth:`~PipelineRuntime.load_checkpoint`.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any, Callable, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError, RunFailure
from ..memory import peak, recompute_stages
from ..ops import RECEIVES
from ..schedule import Schedule
from ..validate import validate
from .comm import tied
from .comm.tied_copies import check_alike, follow, follower_specs
from .comm.agree import LossAgreement
from .comm.agreement import StepChecks, agree_at_construction
from .comm.mesh import PipelineMesh
from .comm.p2p import Transport, make_link_groups
from .comm.reduction import ReductionPlan
from .engine.engine import Engine, StepBatch
from .engine.overlap_streams import OverlapStreams
from .engine.shapes import ShapeBook, infer_boundary_shapes
from .engine.split_backward import WeightGradStash, make_weight_grads_deferrable
from .engine.stage_runner import build_runners
from .guard import check_weights
from .metering.memory_meter import ActivationMeter
from .metering.observers import SizeLearner, StepResult, make_clock, step_result
from .options import RuntimeOptions, runtime_arguments
from .program.program import links, lower
from .sharding.sharded_mesh import ShardedMesh
from .sharding.sharding import local_tensors
from .sharding.tp_plans import param_specs
from .stages import batch_context
from .stages.copies import ModelCopies
from .stages.partition import Stage, build_stage
from .stages.precision import Precision
from .stages.staged_model import StagedModel
from .state_access import StateAccess
from .strategy import choose_strategy

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]

class NonFiniteLoss(RunFailure):
    """The loss of some microbatch is NaN or infinite (weights were not updated)."""


class PipelineRuntime(StateAccess):
    """The stages of one rank, their optimizer, and the engine that runs the schedule's steps.

    Call on every rank of an initialised process group with the same arguments. ``model``
    (:class:`~.stages.staged_model.StagedModel`) is the blocks and their facts (block counts, tied
    weights, a sample input and context, a tensor-parallel plan); ``options``
    (:class:`~.options.RuntimeOptions`) holds the run's knobs; ``mesh`` (default: the whole world is
    one pipeline) places this rank among data-parallel replicas, or, a
    :class:`~.sharding.sharded_mesh.ShardedMesh`, shards the stages inside (FSDP2, tensor parallelism).
    """

    def __init__(self, model: StagedModel, schedule: Schedule, loss_fn: LossFn, optimizer: OptimizerFactory,
                 *older: Any, options: RuntimeOptions = RuntimeOptions(),
                 mesh: Union[PipelineMesh, ShardedMesh, None] = None) -> None:
        """``older``: what the deprecated form ``(build_block, num_blocks, schedule, loss_fn,
        optimizer, sample_input)`` gives past its fourth argument (:func:`~.options.runtime_arguments`)."""
        model, schedule, loss_fn, optimizer, options = runtime_arguments(model, schedule, loss_fn, optimizer, older,
                                                                         options)
        validate(schedule)
        self.model, self.options = model, options
        self.schedule = schedule
        self.recompute = recompute_stages(options.recompute, schedule)
        self.device = options.torch_device
        self.strategy = choose_strategy(mesh, options.timeout_s, self.device)
        self.mesh = self.strategy.mesh
        self.rank = self.mesh.pp_rank
        if self.mesh.pp != schedule.ranks:
            raise ConfigError(f"the schedule has {schedule.ranks} ranks but the pipeline {self.mesh.pp}")
        self.precision = Precision(options.dtype, self.device.type)
        self.loss_fn = loss_fn
        self.copies = ModelCopies(schedule)
        agree_at_construction(self.mesh.world_group, model, schedule, self.copies.length, options)
        model_ranges = model.stage_ranges(self.copies.length)
        self.stage_ranges = self.copies.stage_ranges(model_ranges)
        # shapes first, from blocks no runtime has prepared yet (where the builder builds them)
        self.shapes = ShapeBook(
            lambda sample, context: infer_boundary_shapes(model.build_block, model_ranges, sample, context,
                                                          seed=options.seed, device=self.device),
            schedule, self.copies, self.precision.wire_dtype, model.sample_input, model.sample_context)
        owned = [s for s, r in enumerate(schedule.placement) if r == self.rank]
        self.checks = StepChecks(loss_fn, self.shapes, self.mesh, any(map(self.copies.takes_inputs, owned)),
                                 any(map(self.copies.computes_loss, owned)))
        self.stages: dict[int, Stage] = {s: build_stage(model.build_block, self.stage_ranges[s], s, options.seed,
                                                        self.device) for s in owned}
        self.strategy.tie(self.stages, model.tied)
        self.meter = ActivationMeter()
        self.stash = WeightGradStash(hold=self.meter.hold)
        if schedule.split_backward:
            for stage in self.stages.values():
                make_weight_grads_deferrable(stage, self.stash)
        experts = model.expert_plan if self.mesh.experts is not None else None
        self.state_specs = {s: param_specs(stage, model.tp_plan or {}, experts) for s, stage in self.stages.items()}
        self.follower_specs = follower_specs(self.stages, tied.held(self.stages, model.tied), self.state_specs)
        parts = self.strategy.lay_out(self.stages, model, options, self.meter.exclude)
        self.tied = tied.held(self.stages, model.tied)  # sharding replaced the parameters
        for g, copies in self.tied.items():
            check_alike(copies, model.tied[g])
        self.followers = [p for copies in self.tied.values() for p in copies[1:]]  # not the optimizer's
        every = list({id(p): p for s in owned for p in self.stages[s].parameters()}.values())
        self.parameters = [p for p in every if all(p is not q for q in self.followers)]
        self.meter.exclude(local_tensors(every + [b for s in owned for b in self.stages[s].buffers()]))
        self.sizes = SizeLearner()
        self.optimizer = optimizer(self.parameters)
        self.program = lower(schedule, self.rank)
        self.runners = build_runners(self.stages, self.copies, loss_fn, schedule.microbatches, shapes=self.shapes,
                                     precision=self.precision, meter=self.meter, stash=self.stash,
                                     recompute=frozenset(self.recompute), parts=parts)
        clipping = options.clip_grad_norm is not None
        self.agreement = LossAgreement(schedule.microbatches, clipping and self.strategy.norm_in_agreement, self.mesh,
                                       self.device)
        groups = make_link_groups(links(schedule), options.timeout_s, self.mesh)
        self.transport = Transport(self.program, groups, self.shapes.wire, self.device, options.timeout_s,
                                   host_staging=options.host_staging, global_rank=self.mesh.global_rank)
        self.reductions = ReductionPlan(schedule, self.stage_ranges, model.tied, self.stages, self.mesh,
                                        options.overlap_grad_sync, options.timeout_s,
                                        replicas=self.strategy.replicas_reduced, copies=self.tied)
        self.broadcast_tied()
        self.streams = OverlapStreams(self.device, options.overlap_streams)
        interleaving = options.interleave_pairs and self.mesh.experts is not None  # exchanges to hide
        self.engine = Engine(self.program, self.runners, self.transport, reductions=self.reductions,
                             precision=self.precision, meter=self.meter, streams=self.streams,
                             interleave_timeout_s=options.timeout_s if interleaving else None)
        self.transport.connect()
        self.steps_done = 0
        self.metering = True  # whether this step's saved tensors are counted (see step)

    # -- one step --------------------------------------------------------------------------

    def step(self, inputs: Optional[torch.Tensor], targets: Optional[torch.Tensor],
             context: Optional[dict] = None) -> StepResult:
        """Run one training step on the global batch. ``inputs`` are read on the first stage's
        rank, ``targets`` on the last stage's (other ranks may pass None; pass the inputs on
        every rank when their shape may change between steps); ``context``, a dict of tensors
        with the batch on dim 0, on every rank (:mod:`~.batch_context`). Each data-parallel
        replica takes its own shard of them."""
        batch, reshaped = self._prepare(inputs, targets, context)
        device_baseline = self._start_device_memory()
        self.meter.reset_peak()
        dist.barrier(group=self.mesh.world_group)  # every rank of every replica: the step's times start together
        t0 = perf_counter()
        clock = make_clock(self.device, self.options.sync_actions)
        clock.start()
        losses, marks = self._run_program(batch, clock)
        self.reductions.finish()
        loss, skipped, grad_norm = self._agree(losses)
        if self.options.clip_grad_norm is not None:
            grad_norm = self.strategy.grad_norm(self.reductions.counted, grad_norm)
        if not skipped:
            self._update(grad_norm)
        if self.device.type == "cuda":  # the step ends when the device's work does
            torch.cuda.synchronize(self.device)
        step_time = perf_counter() - t0
        self.steps_done += 1
        return step_result(loss, step_time, marks, clock, skipped, t0, grad_norm,
                           self.meter.peak if self.metering else None, self.device, device_baseline)

    def _prepare(self, inputs, targets, context) -> tuple[StepBatch, bool]:
        """Every rank's batch usable and alike in shape, or every rank raises (agreement.py); this
        replica's microbatches; whether their shapes changed; gradients zeroed."""
        self.checks.before_step(inputs, targets, context, self.steps_done + 1)
        in_mbs, tgt_mbs, ctx_mbs, reshaped = self._split_batch(inputs, targets, context)
        # the meter's hooks cost a few percent of a step: it counts the first step and each step
        # whose shapes changed (what the memory model's promise is checked on), or every step
        self.metering = self.options.meter_every_step or not self.sizes.done or reshaped
        self.optimizer.zero_grad(set_to_none=True)
        for p in self.followers:  # FSDP would add this step's reduced gradients to the last's
            p.grad = None
        self.strategy.start_step()
        return StepBatch(in_mbs, tgt_mbs, ctx_mbs), reshaped

    def _run_program(self, batch: StepBatch, clock) -> tuple[list, list]:
        """The engine runs this rank's program; the loss agreement starts as soon as this rank's
        losses are known; the first step teaches the size learner."""
        agreement = self.agreement
        if agreement.early and not self.engine.losses_per_step:
            agreement.issue([None] * self.schedule.microbatches)
        observer = self.sizes.observe if not self.sizes.done else None
        result = self.engine.run(batch, self.schedule.microbatches, clock, observer,
                                 agreement.issue if agreement.early else None, self.metering)
        self.sizes.done = True
        return result

    def _agree(self, losses: list) -> tuple[float, bool, Optional[float]]:
        """The step's loss and gradient norm as every rank sees them; a step whose loss is not
        finite raises, or (``skip_nonfinite``) is skipped: (loss, skipped, gradient norm)."""
        agreement = self.agreement
        if not agreement.early:
            agreement.issue(losses, self.reductions.counted)
        loss, bad_mb, bad_value, grad_norm = agreement.finish()
        if bad_mb < 0:
            return loss, False, grad_norm
        if not self.options.skip_nonfinite:
            raise NonFiniteLoss(
                f"step {self.steps_done + 1}: the loss of microbatch {bad_mb} is {bad_value} "
                "(weights not updated; --skip-nonfinite skips such steps)"
            )
        self.optimizer.zero_grad(set_to_none=True)
        return loss, True, grad_norm

    def _update(self, grad_norm: Optional[float]) -> None:
        """Clip (torch's own scaling, given the norm over every rank), step the optimizer, and stop every
        rank if a weight became non-finite, or first if the strategy's check of the gradients fails
        (under tp: a partial gradient, :mod:`.sharding.tp_guard`)."""
        self.strategy.before_update(self.named_parameters(unique=True))
        if self.options.clip_grad_norm is not None:
            self.strategy.clip(self.parameters + self.followers, self.options.clip_grad_norm, grad_norm)
        self.optimizer.step()
        follow(self.tied)
        named = [(n, local_tensors([p])[0]) for n, p in self.named_parameters(unique=True)]  # a shard: this rank's piece
        check_weights(named, self.steps_done + 1, self.mesh.world_group, self.device)

    def _split_batch(self, inputs, targets, context) -> tuple:
        """This replica's microbatches of the inputs (where a first stage is), the targets (where
        a last stage is) and the context (everywhere), and whether the microbatches' shapes
        changed (the boundaries are re-inferred then)."""
        m = self.schedule.microbatches
        inputs, targets = self.mesh.shard(inputs), self.mesh.shard(targets)
        if context is not None:
            context = {name: self.mesh.shard(t) for name, t in context.items()}
        ctx_mbs = batch_context.split(context, m, self.device)
        needs_inputs = inputs is not None or any(map(self.copies.takes_inputs, self.stages))
        me = self.mesh.global_rank(self.rank)  # named as the launcher names its processes
        in_mbs = batch_context.microbatches(inputs, m, self.device, "inputs", me) if needs_inputs else None
        tgt_mbs = (batch_context.microbatches(targets, m, self.device, "targets", me)
                   if any(map(self.copies.computes_loss, self.stages)) else None)
        # shapes differ from the last step's: every rank re-infers, each from what it was given
        reshaped = self.shapes.update(in_mbs[0] if in_mbs is not None else None, ctx_mbs[0] if ctx_mbs else None)
        if reshaped:
            self.transport.set_shapes(self.shapes.wire)
        return in_mbs, tgt_mbs, ctx_mbs, reshaped

    def _start_device_memory(self) -> Optional[int]:
        """On CUDA: the bytes allocated at the step's start, the peak counter reset."""
        if self.device.type != "cuda":
            return None
        torch.cuda.reset_peak_memory_stats(self.device)
        return torch.cuda.memory_allocated(self.device)

    # -- what others ask of the runtime ----------------------------------------------------

    @property
    def memory_sizes(self):
        """Per own stage, the activation sizes measured on the first step (None before it)."""
        return self.sizes.sizes if self.sizes.done else None

    def measured_stage_memory(self) -> dict[int, tuple]:
        """Per own stage: (its activation sizes measured on the first step, one microbatch's
        stage input bytes); empty before the first step."""
        return {s: (size, self.runners[s].input_bytes) for s, size in (self.memory_sizes or {}).items()}

    def predicted_peak_activation_bytes(self) -> Optional[float]:
        """What :mod:`pipesched.memory` says this rank holds at most, fed with the per-stage sizes
        measured on the first step (None before it)."""
        sizes = self.memory_sizes
        return None if sizes is None else peak(self.program.actions, sizes)

    def broadcast_tied(self) -> None:
        """Give every copy of each tied parameter its group's value (collective: every rank
        calls it, at start and after loading a checkpoint)."""
        tied.broadcast(self.reductions, self.tied)

    def probe_tensor(self) -> tuple[torch.Size, torch.dtype]:
        """Shape and dtype of an entry crossing ranks (the latency probe's payload)."""
        for msg in (i.message for i in self.program.instructions if i.op in RECEIVES):
            entries = self.shapes.wire[(msg.kind, msg.stage)].entries
            if entries:
                return entries[0].shape, entries[0].dtype
        return torch.Size([1]), torch.float32
