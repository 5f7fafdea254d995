"""``pipesched train``: run a schedule for real on local processes or under torchrun.

torch is imported inside the command, so every other command works without it, and only after
the options that need no torch are checked, so that a plain mistake is refused at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import ConfigError
from ..outfiles import check_output_path
from ..registry import build_schedule
from ..runtime.optimizers import OPTIMIZERS
from ..schedule import Schedule
from . import app, fail
from . import options as opt
from . import train_hf
from .train_layout import Dp, Dtype, check_batch_split, check_layout
from .train_zb_auto import chunks_for_model, given_costs, wants_profile, zb_auto_inputs, zb_auto_profile

TORCH_MISSING = "pipesched train needs PyTorch: pip install 'pipesched[torch]' (CPU: pip install torch==2.13.0)"


@app.command("train")
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
    csv: Optional[Path] = typer.Option(None, "--csv", help="Run a schedule from torch's compute-only CSV."),
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
        None, "--json", help="Write the run's summary (.json): losses, median step, activation bytes per rank."
    ),
    dp: int = Dp,
    dtype: str = Dtype,
    data: Optional[Path] = train_hf.Data,
    hf_weights: Optional[Path] = train_hf.Weights,
    save_hf: Optional[Path] = train_hf.SaveHf,
) -> None:
    """Train a model with a pipeline schedule on real processes (gloo on CPU, NCCL under torchrun on GPUs)."""
    from .train_checks import check_batch_fits, check_checkpoint_flags, check_checkpointing, check_numbers

    # first what needs no torch (importing it costs seconds): a plain mistake is refused at once
    check_numbers(lr, timeout, seed, clip_grad_norm)
    check_checkpoint_flags(checkpoint_dir, checkpoint_every, checkpoint_keep, resume)
    planning_costs = given_costs(schedule, csv, costs, comm)
    for label, value in (("--ranks", ranks), ("--steps", steps), ("--batch-size", batch_size), ("--dp", dp)):
        if value < 1:
            raise ConfigError(f"{label} must be at least 1, got {value}")
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"--optimizer {optimizer!r} is not known: use one of {', '.join(OPTIMIZERS)}")
    if save_params is not None:
        check_output_path(save_params, [".pt", ".pth"])
    if trace is not None:
        check_output_path(trace, [".json"])
    if json_path is not None:
        check_output_path(json_path, [".json"])
    limit, limit_bytes = opt.parse_memory_limit(memory_limit, bytes_known=True)  # auto's profile measures sizes
    profiled = _profiled_by(schedule, csv, memory_limit, limit, limit_bytes, recompute_input)
    counts = _parse_counts(stage_blocks)
    plan = None
    if profiled is None:  # the schedule is known without measuring anything
        plan = _schedule(schedule, csv, ranks, microbatches, chunks, limit, recompute_input)
        recompute = _recompute_of(plan, recompute)
        _check_plan(plan, recompute, dp, batch_size)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise fail(TORCH_MISSING) from None
    from ..runtime.models import KNOWN, MODELS, get_model, is_known
    from ..runtime.partition import block_counts
    from ..runtime.precision import parse_dtype
    from ..runtime.train import TrainConfig, run

    if not is_known(model):
        raise ConfigError(f"--model {model!r} is not known: use {KNOWN}")
    model_options = train_hf.hf_model_options(model, data, hf_weights, save_hf)
    model_def = get_model(model, **model_options)
    measured = profiled == "auto" or (profiled == "zb-auto" and wants_profile(planning_costs, limit, limit_bytes, recompute_input))
    if profiled is not None:  # the schedule needs the model (zb-auto), measured by processes first (auto, zb-auto's profile)
        if measured:
            _check_batch(model_def, batch_size, dp, microbatches, seed)
        if profiled == "auto":
            plan, chosen = _auto(model, ranks, microbatches, batch_size // dp, limit, seed, limit_bytes)  # one replica's batch
            recompute = recompute if recompute is not None else chosen
        else:
            prof = zb_auto_profile(model, ranks, microbatches or 8, batch_size // dp, seed, dtype) if measured else None
            inputs = zb_auto_inputs(prof, planning_costs, limit, limit_bytes, recompute_input)
            plan = inputs.plan(ranks, microbatches or 8, chunks_for_model(chunks, ranks, model_def.num_blocks))
            recompute = _recompute_of(plan, recompute)
        _check_plan(plan, recompute, dp, batch_size)
    if plan is not None:
        try:  # a schedule of several model copies (dualpipe) takes the counts of one copy
            block_counts(model_def.num_blocks, plan.pipeline_length, counts)
        except ConfigError as err:
            raise ConfigError(f"{plan.name} (ranks={plan.ranks}, chunks={plan.chunks}) on --model {model}: {err}") from None
    parse_dtype(dtype)
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
    )
    result = _run_to_the_end(run, cfg)
    if result is None:  # a torchrun rank other than 0
        return
    from .train_report import print_summary, write_outputs

    print_summary(plan, result)
    write_outputs(plan, result, save_params, trace, json_path)
    if model not in MODELS:  # hf:CONFIG.json
        train_hf.report_and_save(plan, model_def, result.params, save_hf)


def _check_batch(model_def, batch_size: int, dp: int, microbatches: Optional[int], seed: int) -> None:
    """The batch's checks before a profile starts processes: it splits, and its memory floor fits."""
    from .train_checks import check_batch_fits

    check_batch_split(batch_size, dp, microbatches or 8)
    check_batch_fits(model_def, batch_size, seed)


def _profiled_by(schedule: str, csv: Optional[Path], memory_limit: Optional[str], limit: Optional[float],
                 limit_bytes: Optional[float], recompute_input: Optional[float]) -> Optional[str]:
    """What the schedule waits for: "auto" (the advisor chooses from measured costs), "zb-auto"
    (planned for the model's blocks, from measured costs and sizes where it wants them), or None
    (made from the options alone, before torch is imported)."""
    if csv is None and schedule.strip().lower() == "auto":
        return "auto"
    measures = csv is None and schedule.strip().lower() == "zb-auto"
    if limit_bytes is not None and not measures:
        raise ConfigError(
            f"--memory-limit {memory_limit}: a size in bytes needs --schedule auto or zb-auto (they "
            "measure the activations); with another schedule give M_B units, e.g. --memory-limit 2"
        )
    if recompute_input is not None:
        opt.check_recompute_input(recompute_input, limit if limit_bytes is None else limit_bytes)
    return "zb-auto" if measures else None


def _check_plan(plan: Optional[Schedule], recompute: Optional[str], dp: int, batch_size: int) -> None:
    """The schedule's own checks: the stages ``--recompute`` names exist, the batch splits."""
    from ..memory import recompute_stages

    if plan is not None:
        recompute_stages(recompute, plan)  # a bad list fails here, before any process starts
    check_layout(plan, dp, batch_size)


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
        if type(err).__name__ in ("DistributedRunError", "NonFiniteLoss", "NonFiniteWeights", "PeerFailure"):
            _say(f"pipesched: error: {err}")
            raise typer.Exit(code=1) from None
        raise


def _say(line: str) -> None:
    """One line on stderr, even when the terminal that would show it is gone (after SIGHUP)."""
    try:
        typer.echo(line, err=True)
    except OSError:
        pass


def _recompute_of(plan: Optional[Schedule], given: Optional[str]) -> Optional[str]:
    """``--recompute`` if given, else the stages the schedule chose to recompute (zb-auto under
    ``--memory-limit --recompute-input``), said on stderr."""
    from ..memory import schedule_recompute

    own = schedule_recompute(plan) if plan is not None else None
    if given is not None or own is None:
        return given
    typer.echo(f"{plan.name}: recomputing stages {own.spec()} to fit the memory limit "
               f"({plan.meta.get('origin', '')}); --recompute overrides it", err=True)
    return own.spec()


def _schedule(name: str, csv: Optional[Path], ranks: int, microbatches: Optional[int], chunks: Optional[int],
              memory_limit: Optional[float] = None, recompute_input: Optional[float] = None) -> Optional[Schedule]:
    if csv is not None:
        from ..validate import validate
        from .plan import load_csv_file

        loaded = validate(load_csv_file(csv, ranks))
        if microbatches is not None and microbatches != loaded.microbatches:
            raise ConfigError(f"{csv} has {loaded.microbatches} microbatches but --microbatches is {microbatches}")
        return loaded
    if name.strip().lower() == "none":
        return None
    return build_schedule(name, ranks, microbatches if microbatches is not None else 8, chunks,
                          memory_limit=memory_limit, recompute_input=recompute_input)


def _auto(model: str, ranks: int, microbatches: Optional[int], batch_size: int,
          memory_limit: Optional[float], seed: int, limit_bytes: Optional[float] = None) -> tuple[Schedule, str]:
    """Profile a few steps, let the advisor choose, and say what it chose and why; returns the
    schedule and whether to recompute ("all" or "none")."""
    from ..runtime.profile import auto_schedule

    plan, advice, prof = auto_schedule(
        model, ranks, microbatches if microbatches is not None else 8, batch_size, memory_limit, seed,
        limit_bytes=limit_bytes,
    )
    typer.echo(prof.summary(), err=True)
    typer.echo(f"auto: {advice.reason}", err=True)
    if advice.recommended.recompute != "none":
        typer.echo("auto: recomputing every stage's activations (--recompute all) to fit", err=True)
    return plan, advice.recommended.recompute


def _parse_counts(text: Optional[str]) -> Optional[tuple[int, ...]]:
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--stage-blocks {text!r}: expected whole numbers separated by commas, e.g. 2,3,3,2") from None
