"""One engine that runs any validated Schedule on a torch.distributed process group.

Each rank interprets its own list of actions (F, I, W, B) from the global schedule; there is no
per-schedule loop. Training semantics equal the unpipelined model's: the batch is split into
``m`` microbatches along dim 0, the loss is the mean over microbatches (each microbatch's loss
is scaled by ``1/m`` before its backward), gradients accumulate over the step, and each rank
steps its optimizer once per step, after its last action and after the step's loss is known to
be finite on every rank; a step that leaves a parameter non-finite stops every rank. Every
step also measures the activation bytes the rank holds (see :mod:`.memory_meter`) against what
:mod:`pipesched.memory` predicts from the sizes measured on the first step. With
``clip_grad_norm`` the gradients are scaled as
``torch.nn.utils.clip_grad_norm_`` scales the unpipelined model's: by the norm over every rank's
parameters, summed in the same all-reduce that agrees on the loss.

With a :class:`~pipesched.runtime.mesh.PipelineMesh` of ``dp`` replicas, every replica runs the
schedule on its shard of the global batch, its pipeline's messages and loss all-reduce on its
``pp`` group; :mod:`~pipesched.runtime.grad_sync` averages the gradients over the replicas while
the pipeline drains, and the loss and the checks agree over every rank. A schedule of several
pipelines (DualPipe) holds a copy of the model per pipeline, whose gradients
:mod:`~pipesched.runtime.copies` sums (with the replicas' mean, in one reduction) while the
pipeline drains. With ``dtype=bfloat16``
see :mod:`~pipesched.runtime.precision`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from time import perf_counter
from typing import Callable, Iterable, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch import nn

from ..bounds import MAX_TIMEOUT_S, check_number
from ..errors import ConfigError
from ..execution import Span
from ..memory import StageMemory, peak, recompute_stages
from ..schedule import Schedule
from ..validate import validate
from .agreement import StepChecks, agree_at_construction
from .clock import EventClock, HostClock
from .copies import ModelCopies, copy_gradient_sync, make_copy_group
from .guard import NonFiniteWeights, first_nonfinite
from .grad_sync import GradientSync
from .memory_meter import ActivationMeter
from .mesh import PipelineMesh
from .overlap_streams import OverlapStreams
from .p2p import Transport, make_link_groups
from .partition import BlockBuilder, Stage, build_stage, infer_boundary_shapes, stage_block_ranges
from .plan import ACT, GRAD, links, plan_rank
from .precision import Precision
from .recompute import recomputed_forward
from .split_backward import WeightGradStash, apply_weight_grads, make_weight_grads_deferrable

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


class NonFiniteLoss(RuntimeError):
    """The loss of some microbatch is NaN or infinite (weights were not updated)."""


@dataclass
class StepResult:
    """The true mean loss of the step (on every rank), this rank's step time and action spans."""

    loss: float
    step_time: float
    spans: list[Span]
    skipped: bool = False
    origin: float = 0.0  # this rank's perf_counter() at the step's start (same clock on one host)
    grad_norm: float = float("nan")  # the whole model's gradient norm before clipping (with clipping)
    peak_activation_bytes: int = 0  # measured: saved tensors, W stashes and stage inputs held at once
    activation_curve: list = field(default_factory=list)  # (seconds from the start, bytes held) per action edge
    device_peak_bytes: Optional[int] = None  # CUDA: max_memory_allocated during the step
    device_baseline_bytes: Optional[int] = None  # CUDA: allocated at the step's start (weights, grads, optimizer)


@dataclass
class _StepState:
    inputs: dict = field(default_factory=dict)  # (stage, mb) -> stage input (a leaf)
    outputs: dict = field(default_factory=dict)  # (stage, mb) -> stage output, or scaled loss
    local_act: dict = field(default_factory=dict)  # (stage, mb) -> output handed to stage+1 here
    local_grad: dict = field(default_factory=dict)  # (stage, mb) -> input grad handed to stage-1 here
    deferred: dict = field(default_factory=dict)  # (stage, mb) -> (stashed Linear backward parts, their holders)
    input_holds: dict = field(default_factory=dict)  # (stage, mb) -> the meter's hold on the stage input


class PipelineRuntime:
    """The stages of one rank, their optimizer, and the engine that runs the schedule's steps.

    Call on every rank of an initialised process group with the same arguments.
    ``sample_input`` is one microbatch's input (or any tensor of that shape and dtype: only
    its shape is used, to size receive buffers once). On CUDA the actions' spans come from CUDA
    events, read once per step; ``sync_actions=True`` synchronises the device after every
    action instead, ``False`` records host times only (when kernels were queued).
    ``host_staging`` (default: on a GPU over gloo) passes messages through host memory.
    ``recompute``: the stages whose activations are recomputed in the backward (full activation
    checkpointing with ``torch.utils.checkpoint``, non-reentrant, one region per block): ``"all"``,
    ``"none"`` or the model's stage indices (DualPipe: ``0..p-1``, each recomputed in both
    copies). Their forward keeps only the blocks' inputs.
    ``mesh`` (default: the whole world is one pipeline) places this rank among data-parallel
    replicas; ``overlap_grad_sync=False`` reduces their gradients (and DualPipe's copies') only
    after the step's last action. ``dtype=torch.bfloat16`` computes under autocast and sends bf16 boundary tensors.
    ``overlap_streams=True`` runs an overlapped pair's forward half on a CUDA stream of its own
    (:mod:`~pipesched.runtime.overlap_streams`; opt-in: no GPU has run it yet); otherwise, and
    always on a CPU, the halves run one after the other.
    """

    def __init__(
        self,
        build_block: BlockBuilder,
        num_blocks: int,
        schedule: Schedule,
        loss_fn: LossFn,
        optimizer: OptimizerFactory,
        sample_input: torch.Tensor,
        *,
        seed: int = 0,
        block_counts: Optional[Sequence[int]] = None,
        device: Optional[torch.device] = None,
        timeout_s: float = 300.0,
        skip_nonfinite: bool = False,
        sync_actions: Optional[bool] = None,
        host_staging: Optional[bool] = None,
        clip_grad_norm: Optional[float] = None,
        recompute: Union[str, Iterable[int], None] = None,
        mesh: Optional[PipelineMesh] = None,
        dtype: torch.dtype = torch.float32,
        overlap_grad_sync: bool = True,
        overlap_streams: bool = False,
    ) -> None:
        validate(schedule)
        check_number("timeout_s", timeout_s, 1e-3, MAX_TIMEOUT_S)  # nan or inf would wait forever
        self.recompute = recompute_stages(recompute, schedule)
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ConfigError(f"the gradient norm to clip to must be above 0, got {clip_grad_norm:g}")
        self.clip_grad_norm = clip_grad_norm
        self.schedule = schedule
        self.mesh = mesh if mesh is not None else PipelineMesh.whole_world(timeout_s)
        self.rank = self.mesh.pp_rank
        if self.mesh.pp != schedule.ranks:
            raise ConfigError(f"the schedule has {schedule.ranks} ranks but the pipeline {self.mesh.pp}")
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.precision = Precision(dtype, self.device.type)
        self.loss_fn = loss_fn
        self.skip_nonfinite = skip_nonfinite
        self.copies = ModelCopies(schedule)
        agree_at_construction(self.mesh.world_group, build_block, num_blocks, schedule, self.copies.length, block_counts,
                              seed, dtype, clip_grad_norm, sample_input)
        ranges = stage_block_ranges(num_blocks, self.copies.length, block_counts)  # of one model copy
        self.stage_ranges = self.copies.stage_ranges(ranges)
        owned = [s for s, r in enumerate(schedule.placement) if r == self.rank]
        self.stages: dict[int, Stage] = {
            s: build_stage(build_block, self.stage_ranges[s], s, seed, self.device) for s in owned
        }
        self.parameters = [p for s in owned for p in self.stages[s].parameters()]
        self.meter = ActivationMeter(exclude=self.parameters + [b for s in owned for b in self.stages[s].buffers()])
        self.stash = WeightGradStash(hold=self.meter.hold)
        if schedule.split_backward:
            for stage in self.stages.values():
                make_weight_grads_deferrable(stage, self.stash)
        self._measured: dict[int, StageMemory] = {}  # per own stage, from the first step
        self.memory_sizes: Optional[dict[int, StageMemory]] = None
        self.input_bytes: dict[int, int] = {}  # per own stage: one microbatch's stage input
        self.optimizer = optimizer(self.parameters)
        outs = infer_boundary_shapes(build_block, ranges, sample_input)
        self.checks = StepChecks(sample_input, loss_fn, schedule.microbatches, self.mesh.dp,
                                 any(map(self.copies.takes_inputs, owned)), any(map(self.copies.computes_loss, owned)),
                                 outs[-1], self.mesh.world_group)
        for s, (_, dtype) in enumerate(outs[:-1]):
            if not dtype.is_floating_point:
                raise ConfigError(
                    f"stage {s} ends at block {ranges[s][-1]} with a {dtype} tensor, but a tensor crossing "
                    "a stage boundary carries a gradient back: give that stage more blocks (block_counts)"
                )
        outs = [(shape, self.precision.wire_dtype(dtype)) for shape, dtype in outs]
        model_stage = self.copies.model_stage
        shapes = {(ACT, s): outs[model_stage(s)] for s in range(schedule.stages)}
        shapes.update({(GRAD, s): outs[model_stage(s) - 1] for s in range(schedule.stages) if not self.copies.takes_inputs(s)})
        self.plan = plan_rank(schedule, self.rank)
        groups = make_link_groups(links(schedule), timeout_s, self.mesh)
        self.transport = Transport(
            self.plan, groups, shapes, self.device, timeout_s, host_staging=host_staging, global_rank=self.mesh.global_rank
        )
        self.grad_sync = self._gradient_sync(overlap_grad_sync, timeout_s)
        self.streams = OverlapStreams(schedule, self.rank, self.device, overlap_streams)
        self.transport.connect()
        self.sync_actions = sync_actions
        self.steps_done = 0

    def _gradient_sync(self, overlap: bool, timeout_s: float) -> Optional[GradientSync]:
        """What reduces this rank's gradients across ranks: the model copies' sum and the
        replicas' mean in one all-reduce per stage (several pipelines), the replicas' mean
        (data parallelism), or nothing."""
        if self.schedule.pipelines > 1:
            group = make_copy_group(self.schedule, self.mesh.grid, self.rank, timeout_s)
            return copy_gradient_sync(self.stages, self.schedule, self.plan.actions, group, self.mesh.dp, overlap)
        if self.mesh.dp > 1:
            return GradientSync(self.stages, self.plan.actions, self.mesh.dp_group, self.mesh.dp, overlap)
        return None

    # -- one step --------------------------------------------------------------------------

    def step(self, inputs: Optional[torch.Tensor], targets: Optional[torch.Tensor]) -> StepResult:
        """Run one training step on the global batch. ``inputs`` are read on the first stage's
        rank, ``targets`` on the last stage's (other ranks may pass None); each data-parallel
        replica takes its own shard of them."""
        m = self.schedule.microbatches
        self.checks.before_step(inputs, targets, self.steps_done + 1)  # every rank's batch is usable, or all raise
        inputs, targets = self.mesh.shard(inputs), self.mesh.shard(targets)
        in_mbs = self._split(inputs, "inputs") if any(map(self.copies.takes_inputs, self.stages)) else None
        tgt_mbs = self._split(targets, "targets") if any(map(self.copies.computes_loss, self.stages)) else None
        self.optimizer.zero_grad(set_to_none=True)
        losses: list[Optional[torch.Tensor]] = [None] * m
        clock = self._clock()
        on_cuda = self.device.type == "cuda"
        if on_cuda:
            baseline = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self.meter.reset_peak()
        dist.barrier(group=self.mesh.world_group)  # every rank of every replica: the step's times start together
        t0 = perf_counter()
        clock.start()
        marks = self._run_actions(in_mbs, tgt_mbs, losses, clock)
        if self.memory_sizes is None:
            self.memory_sizes = dict(self._measured)
        if self.grad_sync is not None:
            self.grad_sync.finish()
        loss, bad_mb, bad_value, grad_norm = self._agree(losses)
        skipped = False
        if bad_mb >= 0:
            if not self.skip_nonfinite:
                raise NonFiniteLoss(
                    f"step {self.steps_done + 1}: the loss of microbatch {bad_mb} is {bad_value} "
                    "(weights not updated; --skip-nonfinite skips such steps)"
                )
            self.optimizer.zero_grad(set_to_none=True)
            skipped = True
        else:
            if self.clip_grad_norm is not None:  # torch's own scaling, given the norm over every rank
                torch.nn.utils.clip_grads_with_norm_(
                    self.parameters, self.clip_grad_norm, torch.tensor(grad_norm, dtype=torch.float64)
                )
            self.optimizer.step()
            self._check_weights()
        if on_cuda:  # the step ends when the device's work does
            torch.cuda.synchronize(self.device)
        step_time = perf_counter() - t0
        times = clock.seconds([t for mark in marks for t in mark[1:3]])
        spans = [Span(mark[0], times[2 * i], times[2 * i + 1]) for i, mark in enumerate(marks)]
        # a forward's bytes show from its start, a backward's highest (a recomputation) too
        curve = [point for i, mark in enumerate(marks) for point in ((times[2 * i], mark[3]), (times[2 * i + 1], mark[4]))]
        self.steps_done += 1
        return StepResult(
            loss, step_time, spans, skipped, t0, grad_norm, self.meter.peak, curve,
            torch.cuda.max_memory_allocated(self.device) if on_cuda else None, baseline if on_cuda else None,
        )

    def predicted_peak_activation_bytes(self) -> Optional[float]:
        """What :mod:`pipesched.memory` says this rank holds at most, fed with the per-stage sizes
        measured on the first step (None before it)."""
        if self.memory_sizes is None:
            return None
        return peak(self.plan.actions, self.memory_sizes)

    def _check_weights(self) -> None:
        """Stop every rank when the optimizer step left a parameter non-finite, naming the step
        (counted from 1) and the model's first such parameter: one flag all-reduced per step,
        the names gathered only on failure."""
        bad = first_nonfinite(self.named_parameters())
        flag = torch.tensor([bad is not None], dtype=torch.int32,
                            device="cpu" if dist.get_backend() == "gloo" else self.device)
        dist.all_reduce(flag, group=self.mesh.world_group)
        if flag.item():
            names = [None] * dist.get_world_size()
            dist.all_gather_object(names, bad, group=self.mesh.world_group)
            raise NonFiniteWeights(self.steps_done + 1, min((n for n in names if n), key=_block_order))

    def _clock(self):
        """Events on CUDA (unless ``sync_actions`` says otherwise), the host clock elsewhere."""
        if self.device.type != "cuda" or self.sync_actions is False:
            return HostClock()
        if self.sync_actions:
            return HostClock(lambda: torch.cuda.synchronize(self.device))
        return EventClock()

    def _split(self, batch: Optional[torch.Tensor], what: str) -> tuple[torch.Tensor, ...]:
        m = self.schedule.microbatches
        if batch is None:
            raise ConfigError(f"rank {self.rank} holds a first or last stage and needs the {what}")
        if batch.shape[0] % m:
            raise ConfigError(f"the batch of {batch.shape[0]} does not split into {m} equal microbatches")
        return batch.to(self.device, non_blocking=True).chunk(m)

    def _run_actions(self, in_mbs, tgt_mbs, losses, clock) -> list[tuple]:
        """Run this rank's actions; returns (action, start mark, end mark, highest bytes held
        during it, bytes held after it) for each."""
        plan, transport, stash, meter, streams = self.plan, self.transport, self.stash, self.meter, self.streams
        takes_inputs, computes_loss = self.copies.takes_inputs, self.copies.computes_loss
        inv_m = 1.0 / self.schedule.microbatches
        state = _StepState()
        marks: list[tuple] = []
        transport.start_step()
        for index, (action, send, need) in enumerate(zip(plan.actions, plan.sends, plan.needs)):
            s, kind, k = action
            key = (s, k)
            received = transport.receive(need, action) if need is not None else None
            before = meter.current
            meter.high = before
            streams.enter(index)  # CUDA: an overlapped pair's forward half on its own stream
            start = clock.mark()  # after the wait: waiting is idle time, not the action's
            if kind == "F":
                if takes_inputs(s):
                    x = in_mbs[k]
                else:
                    x = received if need is not None else state.local_act.pop((s - 1, k))
                    x.requires_grad_(True)
                state.input_holds[key] = meter.hold(x)  # no local alias: released with the backward
                self.input_bytes[s] = state.input_holds[key].nbytes
                last = computes_loss(s)
                y = self._forward(s, x, tgt_mbs[k] if last else None)
                if last:
                    losses[k] = y.detach()
                    y = y * inv_m
                else:
                    if send is not None:
                        transport.send(send, self.precision.to_wire(y.detach()))
                    else:
                        state.local_act[key] = y.detach()
                    # the backward needs only the output's graph: its data lives on only where
                    # the next stage or a saved tensor still holds it (Megatron's deallocation)
                    y.data = torch.empty((), dtype=y.dtype, device=y.device).expand(y.shape)
                state.inputs[key] = x
                state.outputs[key] = y
                del x, y
            elif kind == "W":
                entries, _holders = state.deferred.pop(key)
                apply_weight_grads(entries)
                del entries, _holders
            else:
                x = state.inputs.pop(key)
                y = state.outputs.pop(key)
                if computes_loss(s):
                    grad = None
                else:
                    grad = received if need is not None else state.local_grad.pop((s + 1, k))
                    grad = grad.to(y.dtype)  # a bf16 boundary gradient of an fp32 output
                if kind == "I":
                    entries: list = []
                    stash.collecting = entries
                    torch.autograd.backward(y, grad)
                    stash.collecting = None
                    state.deferred[key] = (entries, stash.holders)
                    stash.holders = []
                else:
                    torch.autograd.backward(y, grad)
                del y, grad
                state.input_holds.pop(key)
                if not takes_inputs(s):
                    if send is not None:
                        transport.send(send, self.precision.to_wire(x.grad))
                    else:
                        state.local_grad[key] = x.grad
                del x
            if self.grad_sync is not None:
                self.grad_sync.after_action(index)
            transport.release_sent()
            streams.leave(index)
            end = clock.mark_end()
            if self.memory_sizes is None:
                self._learn_size(action, before, meter.current, meter.high)
            marks.append((action, start, end, meter.high, meter.current))
        transport.finish_step()
        return marks

    def _forward(self, s: int, x: torch.Tensor, target: Optional[torch.Tensor]) -> torch.Tensor:
        """Stage ``s`` on ``x`` (and the loss against ``target`` on the last stage), its saved
        tensors counted; a recomputed stage keeps only its blocks' inputs and is rebuilt one
        block at a time, counted, when its backward needs it."""
        with self.meter.saved_tensors(), self.precision.autocast():
            if s in self.recompute:
                y = recomputed_forward(self.stages[s], x, self.meter)
            else:
                y = self.stages[s](x)
            return self.loss_fn(y, target) if target is not None else y

    def _learn_size(self, action, before: int, after: int, high: int) -> None:
        """Per-stage sizes from the first step (the largest over its microbatches)."""
        s, kind, _k = action
        seen = self._measured.get(s, StageMemory(0, 0))
        if kind == "F":
            seen = replace(seen, keep=max(seen.keep, after - before))
        elif kind == "B":
            seen = replace(seen, backward_extra=max(seen.backward_extra, high - before))
        elif kind == "I":  # apart from B's: a recomputed I also builds up its stash (dualpipe runs both)
            seen = replace(seen, stash=max(seen.stash, after - before + seen.keep),
                           input_backward_extra=max(seen.input_backward_extra or 0, high - before))
        self._measured[s] = seen

    def _agree(self, losses: list[Optional[torch.Tensor]]) -> tuple[float, int, float, float]:
        """Mean loss, first non-finite microbatch (-1 if none) and its value, and (when clipping)
        the whole model's gradient norm, on every rank: one all-reduce of every microbatch's loss
        (each computed on its pipeline's last stage) and this rank's squared gradients."""
        m = self.schedule.microbatches
        # gloo reduces host memory; NCCL device memory
        info = torch.zeros(m + 1, dtype=torch.float64, device="cpu" if dist.get_backend() == "gloo" else self.device)
        for k, loss in enumerate(losses):
            if loss is not None:
                info[k] = loss.double()
        if self.clip_grad_norm is not None:
            grads = [p.grad for p in self.parameters if p.grad is not None]
            if grads:  # every copy holds the summed gradients: count the model once
                squares = sum(g.detach().double().pow(2).sum() for g in grads) / self.schedule.pipelines
                info[m] = squares.to(info.device)
        dist.all_reduce(info, group=self.mesh.pp_group)
        per_mb = info[:m]
        bad = (~torch.isfinite(per_mb)).nonzero()
        first_bad = int(bad[0, 0]) if bad.numel() else -1
        summary = info.new_tensor([float(per_mb.mean()), first_bad + 1,
                                   float(per_mb[first_bad]) if first_bad >= 0 else 0.0, float(info[m])])
        loss, bad_mb, bad_value, squares = self._across_replicas(summary)
        return loss, int(bad_mb) - 1, bad_value, squares**0.5 if self.clip_grad_norm is not None else float("nan")

    def _across_replicas(self, info: torch.Tensor) -> list[float]:
        """The replicas' (loss, bad microbatch + 1, its value, squares) as one: the mean loss
        over the global batch, the first bad microbatch in global numbering; the squares of the
        reduced gradients are the same on every replica."""
        if self.mesh.dp == 1:
            return info.tolist()
        rows = [torch.empty_like(info) for _ in range(self.mesh.dp)]
        dist.all_gather(rows, info, group=self.mesh.dp_group)
        per_replica = [row.tolist() for row in rows]
        loss = sum(row[0] for row in per_replica) / self.mesh.dp
        m = self.schedule.microbatches
        bad = next(((d, row) for d, row in enumerate(per_replica) if row[1] > 0), None)
        if bad is None:
            return [loss, 0.0, 0.0, per_replica[0][3]]
        d, row = bad
        return [loss, d * m + row[1], row[2], per_replica[0][3]]

    # -- gathering -------------------------------------------------------------------------

    def named_parameters(self) -> Iterable[tuple[str, nn.Parameter]]:
        """This rank's parameters under the unpipelined model's names."""
        for stage in self.stages.values():
            yield from stage.global_named_parameters()

    def gather_state_dict(self, dst: int = 0) -> Optional[dict[str, torch.Tensor]]:
        """The full model's state dict on rank ``dst`` (None elsewhere), unpipelined names."""
        local = {}
        for stage in self.stages.values():
            local.update(stage.global_state_dict())
        return self._gather_dicts(local, dst)

    def gather_gradients(self, dst: int = 0) -> Optional[dict[str, torch.Tensor]]:
        """The last step's gradients of the full model on rank ``dst`` (None elsewhere)."""
        local = {n: p.grad.detach().cpu().clone() for n, p in self.named_parameters() if p.grad is not None}
        return self._gather_dicts(local, dst)

    def _gather_dicts(self, local: dict, dst: int) -> Optional[dict]:
        """Merge the pipeline's parts on global rank ``dst``; replicas hold the same values, so
        only the pipeline that ``dst`` belongs to takes part."""
        if dst not in self.mesh.grid[self.mesh.dp_rank]:
            return None
        return _gather_dicts(local, dst, self.mesh.pp_group, self.mesh.pp)


def _gather_dicts(local: dict, dst: int, group, size: int) -> Optional[dict]:
    parts = [None] * size if dist.get_rank() == dst else None
    dist.gather_object(local, parts, dst=dst, group=group)
    if parts is None:
        return None
    merged = {}
    for part in parts:
        merged.update(part)
    return dict(sorted(merged.items(), key=lambda kv: _block_order(kv[0])))


def _block_order(name: str) -> tuple[int, str]:
    head, _, rest = name.partition(".")
    return (int(head), rest) if head.isdigit() else (1 << 30, name)
