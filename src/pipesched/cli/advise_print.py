"""How ``pipesched advise`` prints one pipeline's advice: the table, the recommendation, how to run it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ..advise import Advice
from ..advise.estimate import TransformerCosts
from ..advise.explain import WHOLE_DEVICE
from ..advise.howto import csv_name, guidance
from ..advise.result import Candidate
from ..errors import ConfigError
from ..memory import format_bytes
from ..units import format_time
from . import advise_layout as layout_options
from .tables import Column, fitted_table

if TYPE_CHECKING:  # rich loads when the advice is printed
    from rich.table import Table


def print_advice(result: Advice, model: Optional[TransformerCosts], top: int,
                 trained_model: Optional[tuple[str, int]] = None) -> None:
    """The ranked table, the recommendation and why, and how to run it (``trained_model``: the
    built-in model and batch size the costs were measured on, if they were)."""
    from ..render.console import output_console

    console = output_console()
    console.print(f"[bold]pipesched advise[/bold]  {_setup_line(result)}")
    if model is not None:
        console.print(_model_line(model))
    console.print(advice_table(result, top, console.width), crop=False, soft_wrap=False)  # uncut, even on a narrow console
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
    from ..runtime.stages.partition import block_counts
    from ..training.models import get_model

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

