"""``pipesched train``: run a schedule for real on local processes or under torchrun.

torch is imported inside the command, so every other command works without it, and only after
the options that need no torch are checked, so that a plain mistake is refused at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..environment import backend as launch_backend, torchrun_rank
from ..errors import ConfigError
from ..outfiles import check_output_path
from ..memory import Recomputed
from ..resolve import Resolved, RunSpec, ScheduleChoice, resolve_schedule
from ..runtime.optimizers import OPTIMIZERS
from ..schedule import Schedule
from . import app, fail
from . import options as opt
from .renamed import deprecated_option as renamed_option, renamed
from . import train_hf
from .train_data import DataFlags, data_options, say_how_text_is_read
from .train_loop import LoopFlags, loop_options
from .train_layout import Dp, Dtype, check_batch_split, check_layout
from ..zb_auto_plan import given_costs

TORCH_MISSING = "pipesched train needs PyTorch: pip install 'pipesched[torch]' (CPU: pip install torch==2.13.0)"


@app.command("train")
@loop_options
@data_options
def train(
    model: str = typer.Option("mlp", "--model", help="mlp (residual MLP stack), gpt (char-level GPT) or "
                              "hf:CONFIG.json (a Hugging Face causal LM, docs/huggingface.md)."),
    schedule: str = typer.Option(
        "1f1b", "--schedule", "-s",
        help="Schedule name, none for the single-process reference, or auto (measure, then pipesched advise picks); "
        "zb-auto measures the costs first and plans for them.",
    ),
    costs: Optional[str] = typer.Option(
        None, "--costs",
        help="With --schedule zb-auto: plan with these costs F,B,W (e.g. 1,1.4,0.6; 1,1,1: unit costs) instead of "
        "measuring them (a short profile before training).",
    ),
    comm: Optional[float] = typer.Option(None, "--comm", help="With --costs: latency of every cross-rank transfer, in cost units."),
    memory_limit: Optional[str] = typer.Option(
        None, "--memory-limit",
        help="Peak activations per rank the schedule must fit: with --schedule auto or zb-auto in M_B or bytes "
        "(40GiB, 512MiB; zb-auto then measures the sizes and may recompute); with another named schedule in M_B "
        "(the V family builds to it, the others check it).",
    ),
    recompute_input: Optional[float] = opt.RecomputeInput,
    ranks: int = opt.Ranks,
    microbatches: Optional[int] = typer.Option(None, "--microbatches", "-m", help="Microbatches per step (default 8; a CSV brings its own)."),
    chunks: Optional[int] = opt.Chunks,
    steps: int = typer.Option(10, "--steps", help="Optimizer steps."),
    batch_size: int = typer.Option(64, "--batch-size", help="Samples per step, split into the microbatches."),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights (block i uses seed+i) and the data."),
    lr: float = typer.Option(0.05, "--lr", help="Learning rate."),
    optimizer: str = typer.Option("sgd", "--optimizer", help="sgd or adamw (torch's defaults but the learning rate)."),
    stage_blocks: Optional[str] = typer.Option(None, "--stage-blocks", help="Blocks per stage, e.g. 2,3,3,2 (dualpipe: per stage of one model copy; default: balanced for the placement)."),
    csv: Optional[Path] = typer.Option(None, "--csv", help="Run a schedule from a torch CSV (compute_only or compute_comms format)."),
    save_params: Optional[Path] = typer.Option(None, "--save-params", help="Write the trained state_dict (.pt), unpipelined names."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write the measured timeline of every step (.json)."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds a rank waits for a peer before failing (a single rank: without finishing a step)."),
    skip_nonfinite: bool = typer.Option(False, "--skip-nonfinite", help="Skip steps whose loss is NaN/inf instead of stopping."),
    clip_grad_norm: Optional[float] = typer.Option(
        None, "--clip-grad-norm", help="Clip the whole model's gradient norm (over every rank) to this, as torch's clip_grad_norm_."
    ),
    checkpoint_dir: Optional[Path] = typer.Option(
        None, "--checkpoint-dir", help="Save checkpoints here (torch.distributed.checkpoint, one folder per step; at least after the last step)."
    ),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", help="With --checkpoint-dir: also save every N steps."),
    checkpoint_keep: int = typer.Option(2, "--checkpoint-keep", help="How many of the newest checkpoints to keep."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the newest complete checkpoint in --checkpoint-dir up to --steps (the total), under any schedule or rank count."
    ),
    recompute: Optional[str] = typer.Option(
        None, "--recompute",
        help="Recompute activations in the backward (activation checkpointing): all, none, or the model's stage "
        "indices such as 0,2 (dualpipe: 0..p-1, recomputed in both model copies).",
    ),
    json_path: Optional[Path] = typer.Option(
        None, "--summary", help="Write the run's summary (.json): losses, median step, activation bytes per rank."
    ),
    old_json_path: Optional[Path] = renamed_option("--json", "--summary"),
    dp: int = Dp,
    dtype: str = Dtype,
    data: Optional[Path] = train_hf.Data,
    hf_weights: Optional[Path] = train_hf.Weights,
    save_hf: Optional[Path] = train_hf.SaveHf,
    loop: LoopFlags = LoopFlags(),
    data_flags: DataFlags = DataFlags(),
) -> None:
    """Train a model with a pipeline schedule on real processes (gloo on CPU, NCCL under torchrun on GPUs)."""
    from .train_checks import check_batch_fits, check_checkpoint_flags, check_checkpointing, check_numbers

    # first what needs no torch (importing it costs seconds): a plain mistake is refused at once
    torchrun_rank()  # a partial torchrun environment left in a shell: refused, not waited on
    json_path = renamed("train", "--json", "--summary", old_json_path, json_path)
    check_numbers(lr, timeout, seed, clip_grad_norm)
    check_checkpoint_flags(checkpoint_dir, checkpoint_every, checkpoint_keep, resume)
    planning_costs = given_costs(schedule, csv, costs, comm)
    for label, value in (("--ranks", ranks), ("--steps", steps), ("--batch-size", batch_size), ("--dp", dp)):
        if value < 1:
            raise ConfigError(f"{label} must be at least 1, got {value}")
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"--optimizer {optimizer!r} is not known: use one of {', '.join(OPTIMIZERS)}")
    loop_run = loop.options(lr, steps, data_flags.held_out)
    data_flags.check()
    if save_params is not None:
        check_output_path(save_params, [".pt", ".pth"])
    if trace is not None:
        check_output_path(trace, [".json"])
    if json_path is not None:
        check_output_path(json_path, [".json"])
    limit, limit_bytes = opt.parse_memory_limit(memory_limit, bytes_known=True)  # auto's profile measures sizes
    if recompute_input is not None:
        opt.check_recompute_input(recompute_input, limit if limit_bytes is None else limit_bytes)
    choice = ScheduleChoice(schedule, ranks, microbatches, chunks, csv, limit, limit_bytes, recompute_input,
                            planning_costs, recompute)
    counts = _parse_counts(stage_blocks)
    plan = None
    if choice.measures is None:  # the schedule is known without measuring anything
        plan, recompute = _resolved(resolve_schedule(choice, say=_say), dp, batch_size)
    try:
        import torch
    except ImportError:
        raise fail(TORCH_MISSING) from None
    launch_backend(cuda=torch.cuda.is_available())  # PIPESCHED_BACKEND checked before any rank starts
    from ..runtime.models import KNOWN, MODELS, get_model, is_known
    from ..runtime.partition import block_counts
    from ..runtime.precision import parse_dtype
    from ..runtime.train import TrainConfig, run

    if not is_known(model):
        raise ConfigError(f"--model {model!r} is not known: use {KNOWN}")
    model_options = {**train_hf.hf_model_options(model, data, hf_weights, save_hf), **data_flags.model_options(model)}
    model_def = get_model(model, **model_options)
    parse_dtype(dtype)
    measured = choice.profiles()
    if choice.measures is not None:  # the schedule needs the model (zb-auto), measured by processes first
        if measured:
            _check_batch(model_def, batch_size, dp, microbatches, seed)
        run_spec = RunSpec(model, batch_size // dp, seed, dtype, timeout)  # one replica's batch
        plan, recompute = _resolved(resolve_schedule(choice, run_spec, _say), dp, batch_size)
    if plan is not None:
        try:  # a schedule of several model copies (dualpipe) takes the counts of one copy
            block_counts(model_def.num_blocks, plan.pipeline_length, counts)
        except ConfigError as err:
            raise ConfigError(f"{plan.name} (ranks={plan.ranks}, chunks={plan.chunks}) on --model {model}: {err}") from None
    if not measured:  # last but the folder: its meta inference imports torch's compiler (seconds of CPU)
        check_batch_fits(model_def, batch_size, seed)
    resume_from = check_checkpointing(checkpoint_dir, resume, steps, model_def, optimizer, lr)  # last: creates the folder
    cfg = TrainConfig(
        model, plan, steps, batch_size, seed=seed, lr=lr, optimizer=optimizer, model_size=model_options,
        block_counts=counts, timeout_s=timeout,
        skip_nonfinite=skip_nonfinite, clip_grad_norm=clip_grad_norm, recompute=recompute,
        want_params=save_params is not None or save_hf is not None,
        show_progress=True, dp=dp, dtype=dtype,
        checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir),
        checkpoint_every=checkpoint_every, checkpoint_keep=checkpoint_keep,
        resume_from=None if resume_from is None else str(resume_from),
        meter_every_step=trace is not None,  # the trace draws the median step's activation bytes
        loop=loop_run,
    )
    if model.startswith("hf:"):  # after every check: a refusal stays one line
        say_how_text_is_read(model, data, data_flags.tokenizer)
    result = _run_to_the_end(run, cfg)
    if result is None:  # a torchrun rank other than 0
        return
    from .train_report import OutputsLost, print_summary, write_outputs

    print_summary(plan, result)
    newest = None
    if checkpoint_dir is not None:
        from ..runtime.checkpoint import latest

        newest = latest(checkpoint_dir)
    try:
        write_outputs(plan, result, save_params, trace, json_path, None if newest is None else str(newest))
    except OutputsLost as err:
        _say(f"pipesched: error: {err}")
        raise typer.Exit(code=1) from None
    if loop_run.report_path is not None:
        from .train_run_report import write_run_report

        try:
            write_run_report(Path(loop_run.report_path), plan, result)
        except OSError as err:
            _say(f"pipesched: error: the run finished, but could not write {loop_run.report_path} ({err.strerror})")
            raise typer.Exit(code=1) from None
        typer.echo(f"wrote {loop_run.report_path} (run report)")
    if model not in MODELS:  # hf:CONFIG.json
        train_hf.report_and_save(plan, model_def, result.params, save_hf)


def _check_batch(model_def, batch_size: int, dp: int, microbatches: Optional[int], seed: int) -> None:
    """The batch's checks before a profile starts processes: it splits, and its memory floor fits."""
    from .train_checks import check_batch_fits

    check_batch_split(batch_size, dp, microbatches or 8)
    check_batch_fits(model_def, batch_size, seed)


def _resolved(resolved: Resolved, dp: int, batch_size: int) -> tuple[Optional[Schedule], Recomputed]:
    """The schedule and the stages to recompute, once the batch is checked to split."""
    check_layout(resolved.schedule, dp, batch_size)
    return resolved.schedule, resolved.recompute


def _run_to_the_end(run, cfg):
    """Run ``cfg``; a failed or stopped run is one line on stderr and a non-zero exit."""
    from ..runtime.launch import RunStopped

    resumable = f" ({cfg.checkpoint_dir} holds what to --resume from)" if cfg.checkpoint_dir else ""
    try:
        return run(cfg)
    except RunStopped as stop:
        _say(f"pipesched: stopped by {stop.signal_name}: the run and every rank were stopped{resumable}")
        raise typer.Exit(code=128 + stop.signum) from None
    except KeyboardInterrupt:
        _say(f"pipesched: stopped by Ctrl-C: the run and every rank were stopped{resumable}")
        raise typer.Exit(code=130) from None
    except Exception as err:
        if type(err).__name__ in ("DistributedRunError", "NonFiniteLoss", "NonFiniteWeights", "PeerFailure",
                                  "CheckpointWriteError"):
            _say(f"pipesched: error: {err}")
            raise typer.Exit(code=1) from None
        raise


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
