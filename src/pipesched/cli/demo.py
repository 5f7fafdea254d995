"""``pipesched demo``: the tour a newcomer runs first.

1. compare every schedule for one configuration, under equal and under skewed costs;
2. draw them: an offline HTML report and two Gantt charts;
3. train a small GPT on two local CPU processes with 1f1b and zb-v, next to the unpipelined
   reference, and show that the losses and weights agree.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..compare import check_size
from ..errors import ConfigError
from ..outfiles import check_output_folder, write_atomic
from ..registry import build_schedule
from ..simulate import simulate
from . import app
from . import options as opt
from .plan import compare_rows
from .plan_print import print_compare

if TYPE_CHECKING:  # rich loads when the tour starts printing
    from rich.console import Console

SKEWED = "1,1.4,0.6"  # backward heavier than weight-gradient work, as with attention


@app.command("demo")
def demo(
    out: Path = typer.Option(Path("pipesched-demo"), "--out", help="Folder for the report and charts."),
    ranks: int = typer.Option(4, "--ranks", "-p", help="Ranks for the comparison and the drawings."),
    microbatches: int = typer.Option(8, "--microbatches", "-m", help="Microbatches for the comparison."),
    steps: int = typer.Option(20, "--steps", help="Training steps per schedule."),
    train: bool = typer.Option(True, "--train/--no-train", help="Train on local CPU processes (needs torch)."),
) -> None:
    """Compare the schedules, draw them, and train a small model across local CPU processes."""
    if steps < 1:
        raise ConfigError(f"--steps must be at least 1, got {steps}")
    equal = opt.setup(ranks, microbatches, None, None, 0.0, None, None)
    skewed = opt.setup(ranks, microbatches, None, SKEWED, 0.1, None, None)
    check_output_folder(out)
    check_size(ranks, microbatches, None)  # the comparison's work, refused before any output
    out.mkdir(parents=True, exist_ok=True)
    from rich.console import Console

    console = Console()

    console.rule(f"[bold]1. Every schedule at p={ranks}, m={microbatches}")
    console.print("Equal costs (F = B = W): the textbook picture.")
    print_compare(equal, compare_rows(equal))
    console.print("Skewed costs (F,B,W = 1,1.4,0.6) with a latency of 0.1 on every transfer:")
    print_compare(skewed, compare_rows(skewed))

    console.rule("[bold]2. Pictures")
    from .draw import write_report

    write_report(equal, out / "report.html")
    from ..render.svg import gantt_svg

    for name in ("1f1b", "zb-v"):
        result = simulate(build_schedule(name, ranks, microbatches))
        write_atomic(out / f"{name}.svg", gantt_svg(result))
    console.print(f"Open [bold]{out / 'report.html'}[/bold] in a browser; charts: {out}/1f1b.svg, {out}/zb-v.svg")

    console.rule("[bold]3. Training a small GPT on 2 local CPU processes")
    if not train:
        console.print("skipped (--no-train)")
        return
    try:
        import torch  # noqa: F401
    except ImportError:
        console.print("skipped: needs PyTorch (pip install torch==2.13.0, then pip install 'pipesched[torch]')")
        return
    _train_tour(console, steps)


def _train_tour(console: Console, steps: int) -> None:
    """Reference vs 1f1b vs zb-v: same data, same seed; report loss and weight agreement."""
    from rich.console import Console
    from rich.table import Table

    from ..training.train import TrainConfig, run

    runs = {}
    for name in ("none", "1f1b", "zb-v"):
        schedule = None if name == "none" else build_schedule(name, ranks=2, microbatches=8)
        cfg = TrainConfig("gpt", schedule, steps, 32, want_params=True, show_progress=True)
        runs[name] = run(cfg)
    reference = runs["none"]
    table = Table(title=f"char-level GPT, {steps} steps, batch 32 in 8 microbatches")
    for column in ("schedule", "first loss", "last loss", "max loss diff vs reference", "max weight diff", "median step"):
        table.add_column(column, justify="left" if column == "schedule" else "right")
    for name, result in runs.items():
        loss_diff = max(abs(a - b) for a, b in zip(result.losses, reference.losses))
        weight_diff = max(
            (result.params[k] - reference.params[k]).abs().max().item() for k in reference.params
        )
        median = statistics.median(result.step_times[1:] or result.step_times)
        table.add_row(
            "reference (no pipeline)" if name == "none" else f"{name} on 2 ranks",
            f"{result.losses[0]:.5f}", f"{result.losses[-1]:.5f}", f"{loss_diff:.1e}",
            f"{weight_diff:.1e}", f"{1000 * median:.1f} ms",
        )
    Console(width=max(console.width, 120)).print(table)
    console.print(
        "Every schedule trains the same model: losses and weights match the unpipelined run to float "
        "precision. (Step times of a tiny model on shared CPU cores say little about GPUs: the "
        "reference runs whole batches in one process, the pipeline pays for messages between "
        "processes.) Run your own: pipesched train --model gpt --schedule zb-v --ranks 2 --steps 50"
    )
