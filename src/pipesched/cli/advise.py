"""``pipesched advise``: which schedule, how many chunks and microbatches, with the numbers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from ..jsontext import json_text
from ..advise import Advice, advise, batch_plan
from ..advise.search import check_search_size
from ..advise.estimate import (
    ATTENTION_KERNELS, DEFAULT_TFLOPS, DTYPE_BYTES, Hardware, TransformerCosts, TransformerSpec,
)
from ..advise.explain import WHOLE_DEVICE
from ..advise.layout import DEFAULT_DP_LATENCY_MS
from ..advise.howto import csv_name, guidance
from ..advise.result import Candidate
from ..costs import Costs
from ..errors import ConfigError
from ..memory import format_bytes
from ..registry import families as registered_families, get_family
from ..units import format_time
from . import app
from . import advise_layout as layout_options
from . import options as opt
from .progress import planning_progress
from .renamed import deprecated_option, renamed
from .tables import Column, fitted_table

if TYPE_CHECKING:  # rich loads when the advice is printed
    from rich.table import Table

_MODEL_FLAGS = ("--layers", "--hidden", "--seq-len")
_HARDWARE_FLAGS = ("--heads", "--vocab", "--attention", "--activation-dtype", "--gpu-memory", "--bandwidth", "--flops")


@app.command("advise")
def advise_cmd(
    ranks: int = opt.Ranks,
    memory_limit: Optional[str] = typer.Option(
        None, "--memory-limit",
        help="Memory per rank: in M_B, activations only (one microbatch's activations of a rank's share); "
        "or in bytes (40GiB, 512MiB) with a model description or --profile: all the advisor counts per GPU "
        "(weights, gradients, optimizer state and activations, as --gpu-memory; with --profile the measured "
        "activations), the bytes it reports as peak_memory_bytes.",
    ),
    microbatches: Optional[int] = typer.Option(None, "--microbatches", "-m", help="Fixed microbatch count M."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", help="Samples per iteration G: the advisor also chooses M."),
    microbatch_size: Optional[int] = typer.Option(None, "--microbatch-size", help="Samples per microbatch b that the costs describe."),
    costs: Optional[str] = opt.CostsOpt,
    comm: Optional[float] = typer.Option(None, "--comm", help="Latency of every cross-rank transfer, in cost units."),
    stage_overhead: Optional[float] = typer.Option(None, "--stage-overhead", help=opt.StageOverhead.help),
    full_backward: Optional[float] = opt.FullBackward,
    stage_multipliers: Optional[str] = opt.Multipliers,
    objective: str = typer.Option("makespan", "--objective", help="makespan (optimizer step syncs ranks) or span."),
    max_chunks: int = typer.Option(4, "--max-chunks", help="Most chunks per rank to try."),
    max_microbatches: Optional[int] = typer.Option(None, "--max-microbatches", help="Most microbatches (default max(G/b, 8p))."),
    min_microbatch_size: Optional[int] = typer.Option(None, "--min-microbatch-size", help="Smallest microbatch (default 1)."),
    overhead: Optional[float] = typer.Option(None, "--overhead", help="With --costs: the part of F, B, W not shrinking."),
    layers: Optional[int] = typer.Option(None, "--layers", help="Model: transformer layers L."),
    hidden: Optional[int] = typer.Option(None, "--hidden", help="Model: hidden size h."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Model: sequence length s."),
    heads: Optional[int] = typer.Option(None, "--heads", help="Model: attention heads a (default h/64)."),
    vocab: Optional[int] = typer.Option(None, "--vocab", help="Model: vocabulary V (adds embedding and head)."),
    attention: Optional[str] = typer.Option(
        None, "--attention", help="Model: flash (default; SDPA keeps no score matrix) or eager (keeps a*s*s per sequence)."
    ),
    dtype: Optional[str] = typer.Option(None, "--activation-dtype", help="Model: activation precision, bf16 (default), fp16 or fp32."),
    gpu_memory: Optional[float] = typer.Option(None, "--gpu-memory", help="GB per device: sets the memory limit."),
    bandwidth: Optional[float] = typer.Option(None, "--bandwidth", help="GB/s between neighbouring ranks: sets comm."),
    flops: Optional[float] = typer.Option(None, "--flops", help=f"Effective TFLOP/s per device (default {DEFAULT_TFLOPS:g})."),
    profile: bool = typer.Option(False, "--profile", help="Measure the costs: run a few steps of --model on --ranks local ranks."),
    model_name: Optional[str] = typer.Option(None, "--model", help="With --profile: mlp (default), gpt or hf:CONFIG.json (train's models)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="With --profile: samples per step (default 64)."),
    profile_steps: Optional[int] = typer.Option(None, "--profile-steps", help="With --profile: steps to measure (default 4)."),
    old_dtype: Optional[str] = deprecated_option("--dtype", "--activation-dtype"),
    schedules: Optional[str] = typer.Option(None, "--schedules", help="Only these schedules, comma-separated (default: all)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Processes for the search (default: the CPUs)."),
    top: int = typer.Option(12, "--top", help="Rows in the table."),
    as_json: bool = typer.Option(False, "--json", help="Print the candidates as a JSON list, best first."),
    gpus: Optional[int] = layout_options.Gpus,
    dp_bandwidth: Optional[float] = layout_options.DpBandwidth,
    dp_latency: Optional[float] = layout_options.DpLatency,
    report: Optional[Path] = layout_options.Report,
) -> None:
    """Search every schedule, chunk count and microbatch count; recommend the fastest that fits."""
    dtype = renamed("advise", "--dtype", "--activation-dtype", old_dtype, dtype)
    opt.check_ranges({  # before any work: each of these sizes the search or enters the cost model
        "--workers": workers, "--max-chunks": max_chunks, "--layers": layers, "--hidden": hidden, "--seq-len": seq_len,
        "--heads": heads, "--vocab": vocab, "--gpus": gpus, "--global-batch": global_batch,
        "--microbatch-size": microbatch_size, "--max-microbatches": max_microbatches,
        "--min-microbatch-size": min_microbatch_size, "--top": top, "--batch-size": batch_size,
        "--profile-steps": profile_steps, "--gpu-memory": gpu_memory, "--bandwidth": bandwidth, "--flops": flops,
        "--dp-bandwidth": dp_bandwidth, "--dp-latency": dp_latency, "--overhead": overhead,
    })
    given = {
        "--layers": layers, "--hidden": hidden, "--seq-len": seq_len, "--heads": heads, "--vocab": vocab,
        "--gpu-memory": gpu_memory, "--bandwidth": bandwidth, "--flops": flops,
        "--attention": attention, "--activation-dtype": dtype,
    }
    profiled = {"--stage-overhead": stage_overhead, "--full-backward": full_backward}  # what a profile measures
    model = None
    described = any(given[f] is not None for f in _MODEL_FLAGS + _HARDWARE_FLAGS)
    mode = "--profile" if profile else "--gpus" if gpus is not None else "a model description" if described else "given costs"
    refuse_ignored(mode, {
        "--overhead": overhead, "--microbatch-size": microbatch_size, "--max-microbatches": max_microbatches,
        "--min-microbatch-size": min_microbatch_size, "--microbatches": microbatches, "--model": model_name,
        "--batch-size": batch_size, "--profile-steps": profile_steps, "--dp-bandwidth": dp_bandwidth,
        "--dp-latency": dp_latency, "--report": report, "--gpus": gpus,
    })
    model_name, batch_size, profile_steps = _or(model_name, "mlp"), _or(batch_size, 64), _or(profile_steps, 4)
    min_microbatch_size, overhead = _or(min_microbatch_size, 1), _or(overhead, 0.0)
    dp_latency = _or(dp_latency, DEFAULT_DP_LATENCY_MS)
    memory_limit, limit_bytes = opt.parse_memory_limit(memory_limit, bytes_known=profile or described)
    if profile:
        result = _profiled(
            ranks, memory_limit, microbatches, given, costs, comm, stage_multipliers, global_batch, profiled,
            model_name, batch_size, profile_steps, limit_bytes=limit_bytes, objective=objective, max_chunks=max_chunks,
            families=_families(schedules), workers=workers, quiet=as_json,
        )
        if as_json:
            typer.echo(json_text(result.to_json()))
        else:
            print_advice(result, None, top, trained_model=(model_name, batch_size))
        return
    if gpus is not None or report is not None:
        layout_options.run(
            gpus, global_batch,
            _model(gpus or ranks, given, microbatch_size, memory_limit, limit_bytes, costs, comm, stage_multipliers,
                   profiled),
            dp_bandwidth, dp_latency, report, as_json, top,
            objective=objective, max_chunks=max_chunks, min_microbatch_size=min_microbatch_size,
            max_microbatches=max_microbatches, families=_families(schedules), workers=workers,
        )
        return
    if described:
        model = _model(ranks, given, microbatch_size, memory_limit, limit_bytes, costs, comm, stage_multipliers,
                       profiled)
        c = None
    else:
        c = Costs.parse(costs, comm=comm or 0.0, multipliers=opt.parse_multipliers(stage_multipliers),
                        stage_overhead=stage_overhead or 0.0, full_backward=full_backward)
    result = advise(
        ranks, memory_limit, microbatches=microbatches, global_batch=global_batch,
        microbatch_size=microbatch_size, costs=c, cost_model=model, objective=objective,
        max_chunks=max_chunks, min_microbatch_size=min_microbatch_size,
        max_microbatches=max_microbatches, overhead=overhead, families=_families(schedules), workers=workers,
        progress=lambda work: planning_progress("advise", work),
    )
    if as_json:
        typer.echo(json_text(result.to_json()))
        return
    print_advice(result, model, top)


IGNORED_BY = {  # what each way of giving the costs does without: refused rather than dropped silently
    "--profile": ("--overhead", "--microbatch-size", "--max-microbatches", "--min-microbatch-size",
                  "--dp-bandwidth", "--dp-latency", "--report", "--gpus"),
    "--gpus": ("--microbatches", "--overhead", "--model", "--batch-size", "--profile-steps"),
    "a model description": ("--overhead", "--model", "--batch-size", "--profile-steps", "--dp-bandwidth", "--dp-latency"),
    "given costs": ("--model", "--batch-size", "--profile-steps", "--dp-bandwidth", "--dp-latency"),
}
WHY_IGNORED = {
    "--profile": "the costs are measured at the profiled microbatches",
    "--gpus": "it chooses the microbatches and costs them from the model",
    "a model description": "the model gives each microbatch size's costs",
    "given costs": "--model, --batch-size and --profile-steps belong to --profile, --dp-* to --gpus",
}


def _or(value, default):
    """A flag's value, or its default where it was not given (flags default to None, so that a
    flag given is told apart from one left out)."""
    return default if value is None else value


def refuse_ignored(mode: str, values: dict) -> None:
    """A ConfigError naming the flags given that ``mode`` would ignore (see :data:`IGNORED_BY`)."""
    ignored = [flag for flag in IGNORED_BY[mode] if values.get(flag) is not None]
    if ignored:
        raise ConfigError(f"advise with {mode} ignores {', '.join(ignored)} ({WHY_IGNORED[mode]}): drop "
                          f"{'it' if len(ignored) == 1 else 'them'}")


def _profiled(ranks, memory_limit, microbatches, given, costs, comm, multipliers, global_batch, profiled,
              model_name, batch_size, steps, quiet: bool, limit_bytes: Optional[float] = None, **options) -> Advice:
    """Advice from costs measured by running the model (needs torch)."""
    clashes = [f for f, v in (("--costs", costs), ("--comm", comm), ("--stage-multipliers", multipliers),
                              *profiled.items(), ("--global-batch", global_batch)) if v is not None]
    clashes += [f for f, v in given.items() if v is not None]
    if clashes:
        raise ConfigError(f"--profile measures the costs itself: drop {', '.join(clashes)}")
    microbatches = microbatches or 8
    chosen = options["families"] if options.get("families") is not None else registered_families()
    check_search_size(ranks, batch_plan(ranks, microbatches), chosen, options["max_chunks"])  # before any rank starts
    try:
        from ..runtime.profile import advise_from_profile, profile
    except ImportError:
        raise ConfigError("--profile needs PyTorch: pip install 'pipesched[torch]'") from None
    prof = profile(model_name, ranks, microbatches, batch_size, steps=steps)
    if not quiet:
        from rich.console import Console

        Console().print(prof.summary())
    return advise_from_profile(prof, memory_limit, limit_bytes=limit_bytes, **options)


def _families(names: Optional[str]) -> Optional[list]:
    if names is None:
        return None
    chosen = [get_family(n) for n in names.split(",") if n.strip()]
    if not chosen:
        raise ConfigError("--schedules needs at least one schedule name (pipesched list shows them)")
    return chosen


def _model(ranks, given, microbatch_size, memory_limit, limit_bytes, costs, comm, multipliers,
           profiled: dict) -> TransformerCosts:
    missing = [f for f in _MODEL_FLAGS if given[f] is None]
    if microbatch_size is None:
        missing.append("--microbatch-size")
    if missing:
        raise ConfigError(
            "a model description needs --layers, --hidden, --seq-len and --microbatch-size; "
            f"missing {', '.join(missing)}"
        )
    for flag, value in (("--costs", costs), ("--comm", comm), ("--stage-multipliers", multipliers), *profiled.items()):
        if value is not None:
            raise ConfigError(f"{flag} cannot be combined with a model description (the model gives the costs)")
    if (memory_limit is not None or limit_bytes is not None) and given["--gpu-memory"] is not None:
        raise ConfigError("give --memory-limit (activations) or --gpu-memory (GB, all of a device), not both")
    dtype = given["--activation-dtype"] if given["--activation-dtype"] is not None else "bf16"  # an empty value is refused below
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"--activation-dtype {dtype!r} is not known: use one of {', '.join(DTYPE_BYTES)}")
    attention = given["--attention"] if given["--attention"] is not None else "flash"
    if attention not in ATTENTION_KERNELS:
        raise ConfigError(f"--attention {attention!r} is not known: use one of {', '.join(ATTENTION_KERNELS)}")
    spec = TransformerSpec(
        given["--layers"], given["--hidden"], given["--seq-len"], microbatch_size,
        heads=given["--heads"], vocab=given["--vocab"], attention=attention, dtype_bytes=DTYPE_BYTES[dtype],
    )
    hardware = Hardware(
        tflops=given["--flops"] if given["--flops"] is not None else DEFAULT_TFLOPS,
        bandwidth=given["--bandwidth"], gpu_memory=given["--gpu-memory"],
    )
    return TransformerCosts(spec, ranks, hardware, limit=memory_limit, memory_bytes=limit_bytes)


def print_advice(result: Advice, model: Optional[TransformerCosts], top: int,
                 trained_model: Optional[tuple[str, int]] = None) -> None:
    """The ranked table, the recommendation and why, and how to run it (``trained_model``: the
    built-in model and batch size the costs were measured on, if they were)."""
    from rich.console import Console

    console = Console()
    console.print(f"[bold]pipesched advise[/bold]  {_setup_line(result)}")
    if model is not None:
        console.print(_model_line(model))
    console.print(advice_table(result, top, console.width), crop=False)  # uncut, even on a narrow console
    best = result.recommended
    console.print(f"[bold green]Recommendation:[/bold green] {result.reason}")
    for note in result.notes:
        console.print(f"  - {note}")
    for line in layout_options.split_lines(best, model):
        console.print(line, highlight=False)
    train = None if trained_model is None else train_command(best, result.ranks, 1, csv_name(best), *trained_model)
    for line in guidance(best, result.ranks, train=train):
        console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)  # commands and code: copied whole, never folded


def train_command(c: Candidate, pp: int, dp: int, csv: str, model: str, batch_size: int) -> Optional[str]:
    """``pipesched train`` running the exported ``csv`` on built-in ``model``, or None when the
    model's blocks do not split into the schedule's stages (train would refuse it)."""
    from ..runtime.models import get_model
    from ..runtime.partition import block_counts

    if batch_size % (dp * c.microbatches):
        return None  # train refuses a batch that does not split into the microbatches
    try:
        block_counts(get_model(model).num_blocks, pp * c.chunks)
    except ConfigError:
        return None
    dp_flag = f" --dp {dp}" if dp > 1 else ""
    recompute = " --recompute all" if c.recompute != "none" else ""
    return f"pipesched train --model {model} --csv {csv} --ranks {pp}{dp_flag} --batch-size {batch_size}{recompute}"


def advice_table(result: Advice, top: int, width: int) -> Table:
    """The ranked candidates that fit (and 1F1B), fitted to ``width`` columns (times with units
    where the costs are milliseconds: a model description, a profile)."""
    shown = [c for c in result.candidates if c.fits][:max(1, top)]
    base = result.baseline
    if base is not None and base not in shown:
        shown.append(base)
    reference = f" (M_B at b={result.plan.microbatch_size})" if len(result.plan.options) > 1 and result.plan.microbatch_size else ""
    sizes = result.plan.global_batch is not None
    in_gb = any(c.memory_gb is not None for c in shown)  # the GB count weights, gradients and optimizer state too
    in_bytes = not in_gb and any(c.peak_memory_bytes is not None for c in shown)
    columns = [Column("#"), Column("schedule", justify="left", wrap=True), Column("chunks", short="v"), Column("m")]
    columns += [Column("b", drop=2)] if sizes else []
    columns += [Column(result.objective), Column("bubble", drop=3), Column("peak M_B", drop=1)]
    columns += [Column(f"GB {WHOLE_DEVICE}")] if in_gb else [Column("peak bytes")] if in_bytes else []
    columns += [Column("vs 1f1b", drop=4)]
    rows, styles = [], []
    for i, c in enumerate(result.candidates):
        if c not in shown:
            continue
        recomputed = c.recompute != "none" and c.peak_memory_bytes is not None  # M_B counts stored activations
        row = [str(i + 1), c.schedule + (" +recompute" if c.recompute != "none" else ""), str(c.chunks),
               str(c.microbatches)] + ([str(c.microbatch_size)] if sizes else [])
        row += [format_time(c.value(result.objective), result.time_unit), f"{100 * c.bubble_ratio:.1f}%",
                "-" if recomputed else f"{c.peak_memory_reference:.3g}" + ("" if c.fits else " (over)")]
        if in_gb:
            row.append(f"{c.memory_gb:.1f}" if c.memory_gb is not None else "-")
        elif in_bytes:
            row.append(format_bytes(c.peak_memory_bytes) if c.peak_memory_bytes is not None else "-")
        row.append(f"{c.speedup_vs_1f1b:.3f}x" if c.speedup_vs_1f1b else "-")
        rows.append(row)
        styles.append("bold green" if i == 0 else ("red" if not c.fits else None))
    caption = f"peak M_B: activations only{reference}" + (
        f"; GB {WHOLE_DEVICE}: weights, gradients, optimizer state and activations (what a limit in bytes bounds)"
        if in_gb else "")
    title = f"{len(result.fitting)} of {len(result.candidates)} candidates fit; best {len(shown)} shown"
    return fitted_table(columns, rows, width, title, caption, styles)


def _setup_line(result: Advice) -> str:
    plan, best = result.plan, result.recommended
    batch = (
        f"global batch {plan.global_batch}, reference m={plan.reference}" if plan.global_batch
        else f"m={plan.reference}"
    )
    c = best.costs if best.scale == 1.0 else None
    cost = f"  F,B,W={c.F:.4g},{c.B:.4g},{c.W:.4g} comm={c.comm:.4g}" if c else ""
    cost += f" stage overhead={c.stage_overhead:.4g}" if c and c.stage_overhead else ""
    cost += f" full backward={c.full_backward:.4g}" if c and c.full_backward is not None else ""
    limit = f"  memory limit {result.memory_limit:g} M_B" if result.memory_limit is not None else ""
    return f"p={result.ranks}  {batch}{cost}{limit}  objective {result.objective}"


def _model_line(model: TransformerCosts) -> str:
    f, b, w = model.layer_times()
    spec = model.spec
    parts = [
        f"per layer F,B,W = {f:.3g},{b:.3g},{w:.3g} ms",
        f"activations {spec.layer_activation_bytes(spec.microbatch_size) / 1e6:.4g} MB per layer and microbatch",
    ]
    if spec.vocab:
        parts.append(f"head F=B=W={model.head_time():.3g} ms")
    parts.append(f"p2p {spec.p2p_bytes(spec.microbatch_size) / 1e6:.3g} MB/microbatch -> comm {model.comm_ms():.3g} ms")
    parts.append(f"params+optimizer {model.state_gb(model.ranks, 'loop'):.3g} GB on the fullest rank (1 chunk)")
    return "model: " + "; ".join(parts)

