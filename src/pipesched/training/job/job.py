"""The train job: a run assembled from its one declared value (:class:`RunConfig`), checked, and
launched on local processes or under torchrun. ``pipesched train`` parses its flags and
``--config`` file into a ``RunConfig`` and hands it here (:mod:`pipesched.cli.train`).

The job runs in named phases, one function each: :func:`_checks_without_torch` (every option that
needs no torch: importing it costs seconds, so a plain mistake is refused at once),
:func:`_model_and_plan` (torch imported, the model built, the schedule resolved, measured first
where it must be), the checks before launch that ``pipesched.hf.pipeline`` makes too
(:mod:`pipesched.training.launch_checks`), :func:`_train_config` (the run as one ``TrainConfig``,
its runtime settings one ``RuntimeOptions``), then the run (:func:`_run_to_the_end`). A refusal
is a ConfigError (one line, exit 2); a failed or stopped run a :class:`~.ended.JobEnded`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ...environment import backend as launch_backend
from ...environment import torchrun_rank
from ...errors import ConfigError, RunFailure
from ...gather_placement import gathers_asked, planned_gathers
from ...memory import Recomputed
from ...outfiles import check_output_path
from ...parallel_layout import ParallelLayout
from ...resolve import Resolved, RunSpec, ScheduleChoice, resolve_schedule
from ...schedule import Schedule
from ...shared_options import check_recompute_input
from ...zb_auto_plan import given_costs
from ..config.run_config import RunConfig, ScheduleSection
from ..dry_run import no_new_folder
from ..checkpoint_checks import check_checkpoint_folder
from ..launch_checks import check_batch_split
from ..loop_options import LoopOptions
from ..optimizers import OPTIMIZERS, make_optimizer
from . import hf_model
from .checks import check_batch_fits, check_checkpoint_flags
from .data import check_data, data_model_options, say_how_text_is_read
from .ended import JobEnded
from .layout import check_layout
from .limits import memory_limits
from .loop import bounded_evaluation, loop_options
from .say import say

TORCH_MISSING = "pipesched train needs PyTorch: pip install 'pipesched[torch]' (CPU: pip install torch==2.13.0)"


@dataclass
class _Checked:
    """What the checks without torch settled: the schedule choice, the loop, the stages' block counts."""

    choice: ScheduleChoice
    loop: LoopOptions
    counts: Optional[tuple[int, ...]]
    dtype: object = None  # the torch dtype, once torch is imported
    state_limit: Optional[float] = None  # --rank-memory-limit in bytes (training/launch_checks.py)


@dataclass(frozen=True)
class Trained:
    """What a finished run leaves for its results to be written: the schedule (None: the
    unpipelined reference), the model, the run's result and its loop options as given (where its
    report goes; its metrics file, which the report's and summary's intervals come from)."""

    plan: Optional[Schedule]
    model_def: object
    result: object
    loop: LoopOptions


def run_job(cfg: RunConfig) -> Optional[Trained]:
    """Check, assemble and run ``cfg``; what rank 0 trained (None on a torchrun rank other than 0)."""
    checked = _checks_without_torch(cfg)
    model_def, plan, recompute, model_options = _model_and_plan(cfg, checked)
    run = cfg.training
    layout = None if plan is None else cfg.layout.of(plan.ranks)  # the run's one layout, its TrainConfig's
    optimizer = make_optimizer(cfg.optimizer.optimizer, cfg.optimizer.lr)
    if cfg.layout.sharded and plan is not None:  # the checks pipesched.hf.pipeline makes too (None: a dry run's auto)
        from ..launch_checks import check_sharded_stages

        check_sharded_stages(model_def, plan, checked.counts, layout, optimizer, checked.state_limit,
                             batch_size=run.batch_size, seed=run.seed, recompute=recompute, dtype=checked.dtype)
    ckpt, dry = cfg.checkpoint, cfg.outputs.dry_run
    with no_new_folder(ckpt.checkpoint_dir if dry else None):
        resume_from = None if ckpt.checkpoint_dir is None else check_checkpoint_folder(
            ckpt.checkpoint_dir, ckpt.resume, model_def, optimizer, steps=run.steps, lock=not dry)  # last: creates the folder
    train_config = _train_config(cfg, checked, plan, layout, recompute, model_options, resume_from)
    if cfg.model.model.startswith("hf:"):  # after every check: a refusal stays one line
        say_how_text_is_read(cfg.model.model, cfg.data.data, cfg.data.tokenizer)
        hf_model.say_what_the_folder_gave(model_def)
    if dry:
        return _dry_run(cfg, checked, plan, layout)
    result = _run_to_the_end(train_config, cfg.outputs.summary)
    return None if result is None else Trained(plan, model_def, result, checked.loop)


def _checks_without_torch(cfg: RunConfig) -> _Checked:
    """Every option that needs no torch, in the order a user fixes them (each one's own range was
    checked where it was given: cli/run_options.py)."""
    sched, out, ckpt = cfg.schedule, cfg.outputs, cfg.checkpoint
    torchrun_rank()  # a partial torchrun environment left in a shell: refused, not waited on
    if cfg.training.verbose:  # every rank reads it (hf.config_file.quiet_transformers): set before any starts
        os.environ["PIPESCHED_VERBOSE"] = "1"
    check_checkpoint_flags(ckpt.checkpoint_dir, ckpt.checkpoint_every, ckpt.resume)
    planning_costs = given_costs(sched.schedule, sched.csv, sched.costs, sched.comm)
    if cfg.optimizer.optimizer not in OPTIMIZERS:
        raise ConfigError(f"--optimizer {cfg.optimizer.optimizer!r} is not known: use one of {', '.join(OPTIMIZERS)}")
    loop_run = loop_options(cfg)
    check_data(cfg.data, cfg.evaluation)
    for path, suffixes in ((out.save_params, [".pt", ".pth"]), (out.trace, [".json"]), (out.summary, [".json"])):
        if path is not None:
            check_output_path(path, suffixes)
    if gathers_asked(sched.gather_plan, sched.gather_time, sched.gather_limit) and not cfg.layout.sharded:
        raise ConfigError("--gather-plan, --gather-time and --gather-limit go with --dp-shard or --tp: "
                          "whole stages gather nothing")
    limit, limit_bytes, state_limit = memory_limits(cfg)
    if sched.recompute_input is not None:
        check_recompute_input(sched.recompute_input, limit if limit_bytes is None else limit_bytes)
    choice = ScheduleChoice(sched.schedule, cfg.layout.ranks, sched.microbatches, sched.chunks, sched.csv, limit,
                            limit_bytes, sched.recompute_input, planning_costs, sched.recompute)
    return _Checked(choice, loop_run, _parse_counts(sched.stage_blocks), state_limit=state_limit)


def _model_and_plan(cfg: RunConfig, checked: _Checked):
    """torch imported, the model defined, the schedule resolved (measured first where it must be):
    (model definition, schedule, stages recomputed, the model's options)."""
    run, layout, model = cfg.training, cfg.layout, cfg.model.model
    choice, plan, recompute = checked.choice, None, cfg.schedule.recompute
    if choice.measures is None:  # the schedule is known without measuring anything
        plan, recompute = _resolved(resolve_schedule(choice, say=say), cfg, choice.costs)
    _import_torch()
    from ...runtime.stages.precision import parse_dtype
    from ..launch_checks import check_experts
    from ..models import KNOWN, get_model, is_known

    if not is_known(model):
        raise ConfigError(f"--model {model!r} is not known: use {KNOWN}")
    model_options = {**hf_model.hf_model_options(model, cfg.data.data, cfg.model.hf_weights, cfg.outputs.save_hf),
                     **data_model_options(model, cfg.data, cfg.evaluation)}
    model_def = get_model(model, **model_options)
    checked.loop = bounded_evaluation(checked.loop, model_def.eval_windows, run.batch_size, say)
    # before the costly checks: an --ep the model or the run cannot take
    check_experts(model_def, plan, cfg.layout.of(1))
    checked.dtype = parse_dtype(cfg.model.dtype)  # parsed once: the run's RuntimeOptions take it
    measured = choice.profiles()
    if choice.measures is not None:  # the schedule needs the model (zb-auto), measured by processes first
        if measured:
            check_batch_split(run.batch_size, layout.data_ranks, cfg.schedule.microbatches or 8)
            check_batch_fits(model_def, run.batch_size, run.seed)
        if not (measured and cfg.outputs.dry_run):  # a dry run starts no process to measure
            run_spec = RunSpec(model, run.batch_size // layout.dp, run.seed, cfg.model.dtype, run.timeout)  # a replica's batch
            plan, recompute = _resolved(resolve_schedule(choice, run_spec, say), cfg, choice.costs)
    if plan is not None:
        _check_block_counts(model_def, plan, checked.counts, model)
    if not measured:  # last but the folder: its meta inference imports torch's compiler (seconds of CPU)
        check_batch_fits(model_def, run.batch_size, run.seed)
    return model_def, plan, recompute, model_options


def _train_config(cfg: RunConfig, checked: _Checked, plan: Optional[Schedule], layout: Optional[ParallelLayout],
                  recompute: Recomputed, model_options: dict, resume_from: Optional[Path]):
    """The run as one ``TrainConfig`` (its runtime settings one ``RuntimeOptions``, the dtype parsed once)."""
    from ...runtime.options import RuntimeOptions
    from ..train import TrainConfig

    run, ckpt, out = cfg.training, cfg.checkpoint, cfg.outputs
    options = RuntimeOptions(seed=run.seed, timeout_s=run.timeout,
                             skip_nonfinite=run.skip_nonfinite, clip_grad_norm=run.clip_grad_norm, recompute=recompute,
                             dtype=checked.dtype, meter_every_step=out.trace is not None,  # a trace draws every step
                             interleave_pairs=not cfg.layout.ep_pairs_in_turn)
    return TrainConfig(
        cfg.model.model, plan, run.steps, run.batch_size, options, block_counts=checked.counts,
        lr=cfg.optimizer.lr, optimizer=cfg.optimizer.optimizer,
        model_size=model_options, want_params=out.save_params is not None or out.save_hf is not None,
        show_progress=True, checkpoint_dir=None if ckpt.checkpoint_dir is None else str(ckpt.checkpoint_dir),
        checkpoint_every=ckpt.checkpoint_every, checkpoint_keep=ckpt.checkpoint_keep,
        resume_from=None if resume_from is None else str(resume_from), loop=checked.loop, layout=layout,
    )


def _dry_run(cfg: RunConfig, checked: _Checked, plan: Optional[Schedule], layout: Optional[ParallelLayout]) -> None:
    """``--dry-run``, every check passed: the run and its layout on stdout (under torchrun: rank 0's), no rank started."""
    from ..config.run_file import run_text
    from ..dry_run import describe

    measured = checked.choice.measures if plan is None and checked.choice.profiles() else None
    launched = torchrun_rank()
    if launched is None or launched.rank == 0:
        print(describe(run_text(cfg), plan, cfg.layout.of(cfg.layout.ranks) if measured else layout, measured),
              end="", flush=True)


def _gathers_placed(plan: Optional[Schedule], sched: ScheduleSection, costs) -> Optional[Schedule]:
    """``plan`` gathering where ``--gather-plan`` places (timed with ``--costs``, else unit costs);
    as it is when the flags leave torch's window (a CSV's own placement included)."""
    if plan is None or not gathers_asked(sched.gather_plan, sched.gather_time, sched.gather_limit):
        return plan
    from ...runtime.program.program import placing_gathers

    return placing_gathers(plan, planned_gathers(plan, costs, sched.gather_plan, sched.gather_time, sched.gather_limit))


def _import_torch() -> None:
    """torch, or one line saying how to install it; the launch backend checked before any rank starts."""
    try:
        import torch
    except ImportError:
        raise JobEnded(f"pipesched: error: {TORCH_MISSING}", 2) from None
    launch_backend(cuda=torch.cuda.is_available())  # PIPESCHED_BACKEND checked before any rank starts


def _check_block_counts(model_def, plan: Schedule, counts: Optional[tuple[int, ...]], model: str) -> None:
    from ...runtime.stages.partition import block_counts

    try:  # a schedule of several model copies (dualpipe) takes the counts of one copy
        block_counts(model_def.num_blocks, plan.pipeline_length, counts)
    except ConfigError as err:
        raise ConfigError(f"{plan.name} (ranks={plan.ranks}, chunks={plan.chunks}) on --model {model}: {err}") from None


def _resolved(resolved: Resolved, cfg: RunConfig, costs) -> tuple[Optional[Schedule], Recomputed]:
    """The schedule, gathering where ``--gather-plan`` places, and the stages to recompute, once
    the layout is checked to take the batch."""
    check_layout(resolved.schedule, cfg.layout, cfg.training.batch_size)
    return _gathers_placed(resolved.schedule, cfg.schedule, costs), resolved.recompute


def _run_to_the_end(cfg, summary: Optional[Path]):
    """Run ``cfg``; a failed or stopped run writes its summary and report up to its last logged
    step, then ends the job in one line with a non-zero exit."""
    from ...runtime.launching.launch import RunStopped
    from ..report.stopped import run_keeping_outputs
    from ..train import run

    resumable = f" ({cfg.checkpoint_dir} holds what to --resume from)" if cfg.checkpoint_dir else ""
    try:
        return run_keeping_outputs(run, cfg, summary)
    except RunStopped as stop:
        raise JobEnded(f"pipesched: stopped by {stop.signal_name}: the run and every rank were stopped{resumable}",
                       128 + stop.signum) from None
    except KeyboardInterrupt:
        raise JobEnded(f"pipesched: stopped by Ctrl-C: the run and every rank were stopped{resumable}", 130) from None
    except RunFailure as err:
        raise JobEnded(f"pipesched: error: {err}", 1) from None


def _parse_counts(text: Optional[str]) -> Optional[tuple[int, ...]]:
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--stage-blocks {text!r}: expected whole numbers separated by commas, e.g. 2,3,3,2") from None
