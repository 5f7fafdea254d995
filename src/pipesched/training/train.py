"""Training runs behind ``pipesched train``: the pipelined run on every rank, and the reference.

The reference (``--schedule none``) trains the same blocks, seeded the same way, on the same
batches, in one process with one ordinary backward: the run every schedule must equal.
Both checkpoint every ``checkpoint_every`` steps and at the end, and resume from a checkpoint
of either (``runtime/checkpoints/checkpoint.py``); the weights are checked finite after every step.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from functools import partial
from time import perf_counter
from typing import Optional

import torch

from ..errors import ConfigError
from ..parallel_layout import ParallelLayout, runtime_layout
from ..schedule import Schedule
from ..runtime.checkpoints import checkpoint
from ..runtime.comm.latency import measure_latency
from ..runtime.comm.mesh import init_pipeline_mesh
from ..runtime.executor import PipelineRuntime
from ..runtime.guard import NonFiniteWeights, first_nonfinite
from ..runtime.launching.launch import rank_device, report_progress, stop_on_termination
from ..runtime.metering.timeline import Timeline
from ..runtime.options import RuntimeOptions
from ..runtime.comm.grad_norm import pieces_norm
from ..runtime.stages.copies import balanced_block_counts
from ..runtime.stages.staged_model import StagedModel
from ..runtime.stages.precision import Precision, dtype_name
from .evaluation import evaluate_model, evaluate_pipeline
from .interval_bubble import IntervalBubble
from .loop_options import LoopOptions
from .metrics import gather_peaks, own_peak_memory
from .models import ModelDef, get_model
from .optimizers import make_optimizer
from .run_gather import gather_memory, gather_timelines
from .run_loop import LoopRecord, make_hooks


@dataclass(frozen=True)
class TrainConfig:
    """Everything a rank needs to rebuild the run by itself (picklable: sent to spawned ranks)."""

    model: str
    schedule: Optional[Schedule]  # None: the single-process reference
    steps: int
    batch_size: int
    # how the runtime runs (seed of the weights and the data, timeout, dtype, clipping,
    # recomputation, ...): one value, the runtime's own
    options: RuntimeOptions = RuntimeOptions()
    block_counts: Optional[tuple[int, ...]] = None  # blocks per stage of one model copy (None: balanced by cost)
    lr: float = 0.05
    optimizer: str = "sgd"  # one of optimizers.OPTIMIZERS
    model_size: dict = field(default_factory=dict)
    want_params: bool = False
    want_grads: bool = False
    show_progress: bool = False
    checkpoint_dir: Optional[str] = None
    checkpoint_every: Optional[int] = None  # with checkpoint_dir: save after every N steps (and the last; None: the last only)
    checkpoint_keep: int = checkpoint.DEFAULT_KEEP
    resume_from: Optional[str] = None  # a checkpoint folder: continue after its step, up to ``steps``
    # the processes' layout: the schedule's ranks x replicas x FSDP shards x tensor-parallel ranks
    # (parallel_layout.runtime_layout; None: one replica of the schedule's pipeline)
    layout: Optional[ParallelLayout] = None
    # other layouts that take turns with this run's own after its steps, in the same processes,
    # for as many rounds (a profile's): see _turns
    alongside: tuple[Schedule, ...] = ()
    loop: LoopOptions = LoopOptions()  # learning-rate schedule, evaluation, metrics (run_loop.py)

    def __post_init__(self) -> None:
        ranks = self.schedule.ranks if self.schedule is not None else 1
        if self.layout is None:
            object.__setattr__(self, "layout", runtime_layout(ranks))
        elif self.layout.pp != ranks:
            raise ConfigError(f"the layout {self.layout} has {self.layout.pp} pipeline ranks, the schedule {ranks}")

    @property
    def world(self) -> int:
        """Processes the run takes: every replica's, shard's and tensor-parallel rank's pipeline ranks."""
        return self.layout.world

    @property
    def data_ranks(self) -> int:
        """How many ways the global batch is split (replicas x shards; tensor-parallel ranks share data)."""
        return self.layout.dp

    def model_def(self) -> ModelDef:
        return get_model(self.model, **self.model_size)

    def checkpoint_due(self, steps_done: int) -> bool:
        """Whether to checkpoint after ``steps_done`` steps."""
        if self.checkpoint_dir is None:
            return False
        return steps_done == self.steps or (self.checkpoint_every is not None and steps_done % self.checkpoint_every == 0)


@dataclass
class TrainResult:
    """What rank 0 brings back: the true loss per step, step times, timelines, latency, params."""

    losses: list[float]
    step_times: list[float]
    timelines: list[Timeline]  # per step, per rank
    comm_latency: float = 0.0
    params: Optional[dict] = None
    grads: Optional[dict] = None  # after the first step
    memory: list = field(default_factory=list)  # per rank: RankMemory
    memory_curves: list = field(default_factory=list)  # per step, per rank: [(seconds, bytes held)]
    stage_memory: dict = field(default_factory=dict)  # stage -> (StageMemory measured, input bytes)
    dp: int = 1  # data-parallel replicas it ran (the figures above are the first replica's)
    dtype: str = "fp32"
    first_step: int = 0  # steps done before this run (resumed from a checkpoint), 0 otherwise
    # with TrainConfig.alongside, per round: this run's schedule first, then each of alongside's
    alongside_timelines: list[list[Timeline]] = field(default_factory=list)
    loop: Optional[LoopRecord] = None  # learning rates, evaluations, metrics (rank 0's)
    layout: Optional[ParallelLayout] = None  # the processes' layout (None: the one-process reference)

    def median_step_time(self, skip: int = 1) -> float:
        times = self.step_times[skip:] or self.step_times
        return statistics.median(times)


def train_reference(cfg: TrainConfig) -> TrainResult:
    """The unpipelined run: whole batch, one forward and one backward per step."""
    md = cfg.model_def()
    model = md.sequential(cfg.options.seed)
    optimizer = make_optimizer(cfg.optimizer, cfg.lr, cfg.loop.weight_decay)(list(model.parameters()))
    saved = checkpoint.tied_view(model, md.tied, md.checkpoint_name)  # what its checkpoints hold
    first = _resume(cfg, saved, optimizer)
    precision = Precision(cfg.options.dtype)
    hooks = make_hooks(cfg, md, optimizer, first, lambda batches: evaluate_model(md, model, batches, precision.autocast),
                       writer=True, gather_memory=lambda: [own_peak_memory(None)], device=torch.device("cpu"), name="reference")
    losses, times, grads = [], [], None
    for step in range(first, cfg.steps):
        x, y = md.batch(step, cfg.batch_size, cfg.options.seed)
        t0 = perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with precision.autocast():
            loss = md.loss_fn(md.forward(model, x), y)
        loss.backward()
        norm = pieces_norm(model.parameters()) if cfg.loop.watched else float("nan")
        if cfg.options.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.options.clip_grad_norm)
        if step == 0 and cfg.want_grads:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
        bad = first_nonfinite(model.named_parameters())
        if bad is not None:
            raise NonFiniteWeights(step + 1, bad)
        times.append(perf_counter() - t0)
        losses.append(loss.item())
        hooks.after_step(step + 1, losses[-1], times[-1], norm)
        if cfg.checkpoint_due(step + 1):
            checkpoint.save(cfg.checkpoint_dir, step + 1, saved, optimizer, cfg.checkpoint_keep)
    hooks.close()
    params = {k: v.detach().clone() for k, v in model.state_dict().items()} if cfg.want_params else None
    return TrainResult(losses, times, [], 0.0, params, grads, dtype=dtype_name(cfg.options.dtype), first_step=first, loop=hooks.record)


def _resume(cfg: TrainConfig, model, optimizer) -> int:
    """Load ``cfg.resume_from`` (if any) and return the steps already done. The learning rate
    is this run's: the hooks' schedule (``--lr`` and its decay) sets it from the resumed step on."""
    if cfg.resume_from is None:
        return 0
    return checkpoint.load(cfg.resume_from, model, optimizer)


def train_worker(rank: int, world: int, cfg: TrainConfig) -> Optional[TrainResult]:
    """One rank's whole run; rank 0 returns the gathered result, the others None."""
    md = cfg.model_def()
    schedule = cfg.schedule
    mesh = _mesh(cfg)
    runtime = _runtime(cfg, md, schedule, cfg.block_counts, mesh)
    first = 0
    if cfg.resume_from is not None:
        first = runtime.load_checkpoint(cfg.resume_from, md.checkpoint_name)
    latency = measure_latency(*runtime.probe_tensor(), rank_device())
    bubble = IntervalBubble(schedule, runtime.mesh.grid[0], latency, frozenset(runtime.recompute))
    hooks = make_hooks(cfg, md, runtime.optimizer, first, partial(evaluate_pipeline, runtime, md.batch_context), writer=rank == 0,
                       gather_memory=partial(gather_peaks, runtime.device), device=runtime.device, name=schedule.name,
                       bubble=bubble)
    losses, times, spans, grads, results = [], [], [], None, []
    report_progress()  # from here a single rank silent for the timeout is stopped by the launcher
    try:
        for step in range(first, cfg.steps):
            x, y = md.batch(step, cfg.batch_size, cfg.options.seed)
            result = runtime.step(x, y, md.batch_context(x))
            losses.append(result.loss)
            times.append(result.step_time)
            spans.append(result.spans)
            results.append(result)
            hooks.after_pipeline_step(runtime, result)
            if step == 0 and cfg.want_grads:
                grads = runtime.gather_gradients()
            if cfg.checkpoint_due(runtime.steps_done):
                runtime.save_checkpoint(cfg.checkpoint_dir, cfg.checkpoint_keep, md.checkpoint_name)
            report_progress()
    finally:
        hooks.close()
    timelines = gather_timelines(spans, runtime.mesh.grid[0])
    memory, curves, stage_memory = gather_memory(runtime, results, runtime.mesh.grid[0])
    params = runtime.gather_state_dict() if cfg.want_params else None
    turns = [runtime, *(_runtime(cfg, md, other, None, mesh) for other in cfg.alongside)] if cfg.alongside else []
    beside_timelines = [gather_timelines(spans, runtime.mesh.grid[0]) for spans in _turns(turns, cfg, md)]
    if rank != 0:
        return None
    return TrainResult(
        losses, times, timelines, latency, params, grads, memory, curves, stage_memory,
        dp=cfg.layout.dp_replicate, dtype=dtype_name(cfg.options.dtype), first_step=first, alongside_timelines=beside_timelines, loop=hooks.record,
        layout=cfg.layout,
    )


def _turns(runtimes: list[PipelineRuntime], cfg: TrainConfig, md: ModelDef) -> list[list]:
    """Per runtime, the spans of one step a round, for ``cfg.steps`` rounds: in each round every
    runtime takes two steps in turn and keeps the second. Taking turns, the runtimes meet the
    machine's drift alike (figures of one round compare); the step kept follows one of its
    own, since a step right after another runtime's ran up to twice as slow on CPU ranks."""
    kept: list[list] = [[] for _ in runtimes]
    for step in range(cfg.steps if runtimes else 0):
        x, y = md.batch(step, cfg.batch_size, cfg.options.seed)
        batch = (x, y, md.batch_context(x))
        for spans, runtime in zip(kept, runtimes):
            runtime.step(*batch)  # follows another runtime's step: not kept
            spans.append(runtime.step(*batch).spans)
        report_progress()
    return kept


def _runtime(cfg: TrainConfig, md: ModelDef, schedule: Schedule, counts: Optional[tuple[int, ...]], mesh) -> PipelineRuntime:
    """One rank's runtime of ``schedule`` under ``cfg``'s options (``counts``: blocks per stage,
    None: balanced by the model's block costs)."""
    x0, _ = md.batch(0, cfg.batch_size, cfg.options.seed)
    one = x0[: cfg.batch_size // (cfg.data_ranks * schedule.microbatches)]  # a microbatch
    model = StagedModel(md.build_block, md.num_blocks, one,
                        block_counts=counts or balanced_block_counts(md.block_costs, schedule), tied=md.tied,
                        sample_context=md.batch_context(one) if md.context is not None else None,
                        tp_plan=md.tp_plan if cfg.layout.tp > 1 else None, expert_plan=md.expert_plan)
    return PipelineRuntime(model, schedule, md.loss_fn, make_optimizer(cfg.optimizer, cfg.lr, cfg.loop.weight_decay),
                           options=replace(cfg.options, device=rank_device()), mesh=mesh)


def _mesh(cfg: TrainConfig):
    """This rank's place: replicas of a pipeline, or a sharded layout (FSDP shards, tensor parallelism)."""
    if not cfg.layout.sharded:
        return init_pipeline_mesh(cfg.schedule.ranks, cfg.layout.dp_replicate, cfg.options.timeout_s, cfg.layout.ep)
    from ..runtime.sharding.sharded_mesh import init_sharded_mesh

    return init_sharded_mesh(cfg.layout, cfg.options.timeout_s, rank_device().type)


def run(cfg: TrainConfig) -> Optional[TrainResult]:
    """Run ``cfg``: the reference in this process, the pipeline on spawned local ranks, or this
    process's rank under torchrun (the result then comes back on rank 0 only).
    SIGTERM and SIGHUP raise ``launch.RunStopped`` (local ranks stopped first)."""
    if cfg.schedule is None:
        torch.set_num_threads(1)
        with stop_on_termination():
            return train_reference(cfg)
    from ..runtime.launching.launch import run_torchrun, spawn, under_torchrun

    if under_torchrun():
        return run_torchrun(train_worker, cfg, cfg.options.timeout_s)
    if cfg.checkpoint_dir is not None or cfg.resume_from is not None:
        checkpoint.import_now()  # once, before the ranks fork (runtime/launching/rank_start.py)
    return spawn(train_worker, cfg.world, cfg, cfg.options.timeout_s)[0]
