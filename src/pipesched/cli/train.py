"""``pipesched train``: run a schedule for real on local processes or under torchrun.

The command runs in named phases, one function each: :func:`_checks_without_torch` (every
option that needs no torch: importing it costs seconds, so a plain mistake is refused at once),
:func:`_model_and_plan` (torch imported, the model built, the schedule resolved, measured
first where it must be), :func:`_config` (the run as one ``TrainConfig``, its runtime settings one
``RuntimeOptions``), the run (:func:`_run_to_the_end`), then :func:`_write_results`. A failure
while running is a :class:`~pipesched.errors.RunFailure`: one line, exit 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from ..environment import backend as launch_backend
from ..environment import torchrun_rank
from ..errors import ConfigError, RunFailure
from ..memory import Recomputed
from ..outfiles import check_output_path
from ..resolve import MEASURING, Resolved, RunSpec, ScheduleChoice, resolve_schedule
from ..runtime.training.optimizers import OPTIMIZERS
from ..schedule import Schedule
from ..zb_auto_plan import given_costs
from . import app, fail, train_hf
from . import options as opt
from .gather_flags import gathers_asked, planned_gathers
from .renamed import renamed
from .train_data import DataFlags, data_options, say_how_text_is_read
from .train_flags import (
    CheckpointFlags,
    OutputFlags,
    RunFlags,
    ScheduleFlags,
    checkpoint_options,
    output_options,
    run_options,
    schedule_options,
)
from .train_layout import check_batch_split, check_layout, check_sharding
from .train_loop import LoopFlags, loop_options

TORCH_MISSING = "pipesched train needs PyTorch: pip install 'pipesched[torch]' (CPU: pip install torch==2.13.0)"


@dataclass
class _Checked:
    """What the checks without torch settled: the schedule choice, the loop, the summary's path."""

    choice: ScheduleChoice
    loop: object
    summary: Optional[Path]
    counts: Optional[tuple[int, ...]]
    dtype: object = None  # the torch dtype, once torch is imported
    state_limit: Optional[float] = None  # --memory-limit in bytes on a sharded layout (train_memory.py)


@app.command("train")
@run_options
@schedule_options
@checkpoint_options
@output_options
@loop_options
@data_options
def train(run: RunFlags = RunFlags(), sched: ScheduleFlags = ScheduleFlags(), ckpt: CheckpointFlags = CheckpointFlags(),
          out: OutputFlags = OutputFlags(), loop: LoopFlags = LoopFlags(), data_flags: DataFlags = DataFlags()) -> None:
    """Train a model with a pipeline schedule on real processes (gloo on CPU, NCCL under torchrun on GPUs)."""
    checked = _checks_without_torch(run, sched, ckpt, out, loop, data_flags)
    model_def, plan, recompute, model_options = _model_and_plan(run, sched, out, data_flags, checked)
    check_sharding(model_def, sched.dp_shard, sched.tp)
    if sched.dp_shard > 1 or sched.tp > 1:
        from .train_memory import check_sharded_stages

        check_sharded_stages(model_def, plan, checked.counts, sched.dp, sched.dp_shard, sched.tp, run.optimizer,
                             checked.state_limit, batch_size=run.batch_size, seed=run.seed, recompute=recompute,
                             dtype=checked.dtype)
    from .train_checks import check_checkpointing

    resume_from = check_checkpointing(ckpt.checkpoint_dir, ckpt.resume, run.steps, model_def, run.optimizer, run.lr)  # last: creates the folder
    cfg = _config(run, sched, ckpt, out, checked, plan, recompute, model_options, resume_from)
    if run.model.startswith("hf:"):  # after every check: a refusal stays one line
        say_how_text_is_read(run.model, out.data, data_flags.tokenizer)
        train_hf.say_what_the_folder_gave(model_def)
    result = _run_to_the_end(cfg)
    if result is not None:  # None: a torchrun rank other than 0
        _write_results(run, ckpt, out, checked, plan, model_def, result)


def _checks_without_torch(run: RunFlags, sched: ScheduleFlags, ckpt: CheckpointFlags, out: OutputFlags,
                          loop: LoopFlags, data_flags: DataFlags) -> _Checked:
    """Every option that needs no torch, in the order a user fixes them."""
    from .train_checks import check_checkpoint_flags, check_numbers

    torchrun_rank()  # a partial torchrun environment left in a shell: refused, not waited on
    if run.verbose:  # every rank reads it (hf.config_file.quiet_transformers): set before any starts
        os.environ["PIPESCHED_VERBOSE"] = "1"
    summary = renamed("train", "--json", "--summary", out.old_json_path, out.summary)
    check_numbers(run.lr, run.timeout, run.seed, run.clip_grad_norm)
    check_checkpoint_flags(ckpt.checkpoint_dir, ckpt.checkpoint_every, ckpt.checkpoint_keep, ckpt.resume)
    planning_costs = given_costs(sched.schedule, sched.csv, sched.costs, sched.comm)
    for label, value in (("--ranks", sched.ranks), ("--steps", run.steps), ("--batch-size", run.batch_size), ("--dp", sched.dp)):
        if value < 1:
            raise ConfigError(f"{label} must be at least 1, got {value}")
    if run.optimizer not in OPTIMIZERS:
        raise ConfigError(f"--optimizer {run.optimizer!r} is not known: use one of {', '.join(OPTIMIZERS)}")
    loop_run = loop.options(run.lr, run.steps, data_flags.held_out)
    data_flags.check()
    for path, suffixes in ((out.save_params, [".pt", ".pth"]), (out.trace, [".json"]), (summary, [".json"])):
        if path is not None:
            check_output_path(path, suffixes)
    if gathers_asked(sched.gather_plan, sched.gather_time, sched.gather_limit) and sched.dp_shard == 1 and sched.tp == 1:
        raise ConfigError("--gather-plan, --gather-time and --gather-limit go with --dp-shard or --tp: "
                          "whole stages gather nothing")
    limit, limit_bytes = opt.parse_memory_limit(sched.memory_limit, bytes_known=True)  # auto's profile measures sizes
    state_limit = None
    if limit_bytes is not None and (sched.dp_shard > 1 or sched.tp > 1) and (sched.csv is not None or sched.schedule.strip().lower() not in MEASURING):
        state_limit, limit_bytes = limit_bytes, None  # the layout's predicted state, checked once the model is known
    if sched.recompute_input is not None:
        opt.check_recompute_input(sched.recompute_input, limit if limit_bytes is None else limit_bytes)
    choice = ScheduleChoice(sched.schedule, sched.ranks, sched.microbatches, sched.chunks, sched.csv, limit, limit_bytes,
                            sched.recompute_input, planning_costs, sched.recompute)
    return _Checked(choice, loop_run, summary, _parse_counts(sched.stage_blocks), state_limit=state_limit)


def _model_and_plan(run: RunFlags, sched: ScheduleFlags, out: OutputFlags, data_flags: DataFlags, checked: _Checked):
    """torch imported, the model defined, the schedule resolved (measured first where it must be):
    (model definition, schedule, stages recomputed, the model's options)."""
    from .train_checks import check_batch_fits

    choice, plan, recompute = checked.choice, None, sched.recompute
    if choice.measures is None:  # the schedule is known without measuring anything
        plan, recompute = _resolved(resolve_schedule(choice, say=_say), sched, run.batch_size, choice.costs)
    _import_torch()
    from ..runtime.stages.precision import parse_dtype
    from ..runtime.training.models import KNOWN, get_model, is_known

    if not is_known(run.model):
        raise ConfigError(f"--model {run.model!r} is not known: use {KNOWN}")
    model_options = {**train_hf.hf_model_options(run.model, out.data, out.hf_weights, out.save_hf),
                     **data_flags.model_options(run.model)}
    model_def = get_model(run.model, **model_options)
    checked.dtype = parse_dtype(run.dtype)  # parsed once: the run's RuntimeOptions take it
    measured = choice.profiles()
    if choice.measures is not None:  # the schedule needs the model (zb-auto), measured by processes first
        if measured:
            check_batch_split(run.batch_size, sched.dp * sched.dp_shard, sched.microbatches or 8)
            check_batch_fits(model_def, run.batch_size, run.seed)
        run_spec = RunSpec(run.model, run.batch_size // sched.dp, run.seed, run.dtype, run.timeout)  # one replica's batch
        plan, recompute = _resolved(resolve_schedule(choice, run_spec, _say), sched, run.batch_size, choice.costs)
    if plan is not None:
        _check_block_counts(model_def, plan, checked.counts, run.model)
    if not measured:  # last but the folder: its meta inference imports torch's compiler (seconds of CPU)
        check_batch_fits(model_def, run.batch_size, run.seed)
    return model_def, plan, recompute, model_options


def _config(run: RunFlags, sched: ScheduleFlags, ckpt: CheckpointFlags, out: OutputFlags, checked: _Checked,
            plan: Optional[Schedule], recompute: Recomputed, model_options: dict, resume_from):
    """The run as one ``TrainConfig`` (its runtime settings one ``RuntimeOptions``, the dtype parsed once)."""
    from ..runtime.options import RuntimeOptions
    from ..runtime.training.train import TrainConfig

    options = RuntimeOptions(seed=run.seed, block_counts=checked.counts, timeout_s=run.timeout,
                             skip_nonfinite=run.skip_nonfinite, clip_grad_norm=run.clip_grad_norm, recompute=recompute,
                             dtype=checked.dtype, meter_every_step=out.trace is not None)  # a trace draws every step
    return TrainConfig(
        run.model, plan, run.steps, run.batch_size, options, lr=run.lr, optimizer=run.optimizer,
        model_size=model_options, want_params=out.save_params is not None or out.save_hf is not None,
        show_progress=True, checkpoint_dir=None if ckpt.checkpoint_dir is None else str(ckpt.checkpoint_dir),
        checkpoint_every=ckpt.checkpoint_every, checkpoint_keep=ckpt.checkpoint_keep,
        resume_from=None if resume_from is None else str(resume_from), dp=sched.dp, dp_shard=sched.dp_shard,
        tp=sched.tp, loop=checked.loop,
    )


def _write_results(run: RunFlags, ckpt: CheckpointFlags, out: OutputFlags, checked: _Checked, plan, model_def, result) -> None:
    """The summary on the terminal, then the files the run was asked to write (one line, exit 1, if
    one cannot be written: the trained weights are kept where it says)."""
    from ..runtime.training.models import MODELS
    from .train_report import OutputsLost, print_summary, write_outputs

    print_summary(plan, result)
    newest = None
    if ckpt.checkpoint_dir is not None:
        from ..runtime.checkpoints.checkpoint import latest

        newest = latest(ckpt.checkpoint_dir)
    try:
        write_outputs(plan, result, out.save_params, out.trace, checked.summary, None if newest is None else str(newest))
    except OutputsLost as err:
        _say(f"pipesched: error: {err}")
        raise typer.Exit(code=1) from None
    report = checked.loop.report_path
    if report is not None:
        from .train_run_report import write_run_report

        try:
            write_run_report(Path(report), plan, result)
        except OSError as err:
            _say(f"pipesched: error: the run finished, but could not write {report} ({err.strerror})")
            raise typer.Exit(code=1) from None
        typer.echo(f"wrote {report} (run report)")
    if run.model not in MODELS:  # hf:CONFIG.json
        train_hf.report_and_save(plan, model_def, result.params, out.save_hf)


def _gathers_placed(plan: Optional[Schedule], sched: ScheduleFlags, costs) -> Optional[Schedule]:
    """``plan`` gathering where ``--gather-plan`` places (timed with ``--costs``, else unit costs);
    as it is when the flags leave torch's window (a CSV's own placement included)."""
    if plan is None or not gathers_asked(sched.gather_plan, sched.gather_time, sched.gather_limit):
        return plan
    from ..runtime.program.program import placing_gathers

    return placing_gathers(plan, planned_gathers(plan, costs, sched.gather_plan, sched.gather_time, sched.gather_limit))


def _import_torch() -> None:
    """torch, or one line saying how to install it; the launch backend checked before any rank starts."""
    try:
        import torch
    except ImportError:
        raise fail(TORCH_MISSING) from None
    launch_backend(cuda=torch.cuda.is_available())  # PIPESCHED_BACKEND checked before any rank starts


def _check_block_counts(model_def, plan: Schedule, counts: Optional[tuple[int, ...]], model: str) -> None:
    from ..runtime.stages.partition import block_counts

    try:  # a schedule of several model copies (dualpipe) takes the counts of one copy
        block_counts(model_def.num_blocks, plan.pipeline_length, counts)
    except ConfigError as err:
        raise ConfigError(f"{plan.name} (ranks={plan.ranks}, chunks={plan.chunks}) on --model {model}: {err}") from None


def _resolved(resolved: Resolved, sched: ScheduleFlags, batch_size: int, costs) -> tuple[Optional[Schedule], Recomputed]:
    """The schedule, gathering where ``--gather-plan`` places, and the stages to recompute, once
    the layout is checked to take the batch."""
    check_layout(resolved.schedule, sched.dp, batch_size, dp_shard=sched.dp_shard, tp=sched.tp)
    return _gathers_placed(resolved.schedule, sched, costs), resolved.recompute


def _run_to_the_end(cfg):
    """Run ``cfg``; a failed or stopped run is one line on stderr and a non-zero exit."""
    from ..runtime.launching.launch import RunStopped
    from ..runtime.training.train import run

    resumable = f" ({cfg.checkpoint_dir} holds what to --resume from)" if cfg.checkpoint_dir else ""
    try:
        return run(cfg)
    except RunStopped as stop:
        _say(f"pipesched: stopped by {stop.signal_name}: the run and every rank were stopped{resumable}")
        raise typer.Exit(code=128 + stop.signum) from None
    except KeyboardInterrupt:
        _say(f"pipesched: stopped by Ctrl-C: the run and every rank were stopped{resumable}")
        raise typer.Exit(code=130) from None
    except RunFailure as err:
        _say(f"pipesched: error: {err}")
        raise typer.Exit(code=1) from None


def _say(line: str) -> None:
    """One line on stderr, even when the terminal that would show it is gone (after SIGHUP)."""
    try:
        typer.echo(line, err=True)
    except OSError:
        pass


def _parse_counts(text: Optional[str]) -> Optional[tuple[int, ...]]:
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--stage-blocks {text!r}: expected whole numbers separated by commas, e.g. 2,3,3,2") from None
