"""Options shared by every command that builds a schedule (the flags of DESIGN.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import typer

from ..costs import Costs
from ..errors import ConfigError

Ranks = typer.Option(4, "--ranks", "-p", help="Pipeline ranks (devices), p.")
Microbatches = typer.Option(8, "--microbatches", "-m", help="Microbatches per iteration, m.")
Chunks = typer.Option(None, "--chunks", "-v", help="Chunks (stages) per rank, v; default per schedule.")
CostsOpt = typer.Option(None, "--costs", help="Per-microbatch costs F,B,W of one rank's share, e.g. 1,1.4,0.6.")
Comm = typer.Option(0.0, "--comm", help="Latency of every cross-rank transfer, in cost units.")
MemoryLimit = typer.Option(
    None, "--memory-limit",
    help="Peak activations per rank, in one microbatch's activations (M_B); sizes such as 40GiB where the activation size is known.",
)
Objective = typer.Option(
    None, "--objective",
    help="What searching schedules (zb-auto, the V family) minimise: makespan (default; ranks "
    "synchronise at the optimizer step) or span (iterations overlap).",
)
Overlap = typer.Option(
    1.0, "--overlap",
    help="How much an overlapped forward and backward (OVERLAP_F_B, dualpipev) slow each other: "
    "the pair takes max(F,B) + OVERLAP * min(F,B); 1 = one after the other (what the runtime "
    "does on CPU), 0 = the shorter fully hidden.",
)
RecomputeInput = typer.Option(
    None, "--recompute-input",
    help="With --memory-limit: zb-auto may also recompute activations on some stages where that is "
    "faster than a leaner order; SHARE is what a recomputed stage keeps (its input) of its "
    "activations, e.g. 0.05. Where the sizes are known (train -s zb-auto measures them, simulate "
    "--activation-bytes KEEP,STASH,INPUT gives them) the share comes from them and this overrides it.",
)
Multipliers = typer.Option(
    None, "--stage-multipliers", help="Cost factors along the model's depth, e.g. 1.3,1,1,1.3."
)


@dataclass(frozen=True)
class Setup:
    """What the shared flags describe."""

    ranks: int
    microbatches: int
    chunks: Optional[int]
    costs: Costs
    memory_limit: Optional[float]
    objective: Optional[str] = None  # None: each family's default (makespan)
    recompute_input: Optional[float] = None  # zb-auto may recompute; what a recomputed stage keeps


def parse_memory_limit(text: Optional[str], bytes_known: bool) -> tuple[Optional[float], Optional[float]]:
    """``--memory-limit`` as (M_B units, bytes): a plain number is M_B, a size with a unit
    (``40GiB``, ``512MiB``) bytes, accepted only where the activation size is known."""
    from ..memory import parse_size

    if text is None:
        return None, None
    try:
        size = parse_size(text)
    except ValueError as err:
        raise ConfigError(f"--memory-limit {err}") from None
    value = size if size is not None else float(text)
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"--memory-limit must be a finite number above 0, got {text}")
    if size is None:
        return value, None
    if not bytes_known:
        raise ConfigError(
            f"--memory-limit {text}: a size in bytes needs the activation size per microbatch "
            "(pipesched advise with a model description or --profile, pipesched train --schedule auto); "
            "here give it in M_B units, e.g. --memory-limit 4"
        )
    return None, size


def parse_multipliers(text: Optional[str]) -> Optional[tuple[float, ...]]:
    if text is None or not text.strip():
        return None
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--stage-multipliers {text!r}: expected numbers separated by commas") from None


def setup(
    ranks: int,
    microbatches: int,
    chunks: Optional[int],
    costs: Optional[str],
    comm: float,
    memory_limit: Optional[str],
    multipliers: Optional[str],
    objective: Optional[str] = None,
    overlap: float = 1.0,
    recompute_input: Optional[float] = None,
) -> Setup:
    """Check and bundle the shared flags (bad values raise ConfigError: one line, exit 2)."""
    if ranks < 1:
        raise ConfigError(f"--ranks must be at least 1, got {ranks}")
    if microbatches < 1:
        raise ConfigError(f"--microbatches must be at least 1, got {microbatches}")
    if chunks is not None and chunks < 1:
        raise ConfigError(f"--chunks must be at least 1, got {chunks}")
    limit, _ = parse_memory_limit(memory_limit, bytes_known=False)
    if objective is not None:
        from ..schedules.choose import check_objective

        check_objective(objective)
    if recompute_input is not None:
        check_recompute_input(recompute_input, limit)
    parsed = Costs.parse(costs, comm=comm, multipliers=parse_multipliers(multipliers), overlap=overlap)
    return Setup(ranks, microbatches, chunks, parsed, limit, objective, recompute_input)


def recompute_limit(s: Setup) -> Optional[float]:
    """The memory limit when the flags have zb-auto search recomputation (what its planning
    work counts), else None."""
    return s.memory_limit if s.recompute_input is not None else None


def check_recompute_input(share: float, limit: Optional[float]) -> None:
    """``--recompute-input`` is a share from 0 to below 1, and steers only a search under a limit."""
    if not (math.isfinite(share) and 0 <= share < 1):
        raise ConfigError(f"--recompute-input must be from 0 to below 1 (what a recomputed stage keeps of its activations), got {share:g}")
    if limit is None:
        raise ConfigError("--recompute-input needs --memory-limit: without a limit recomputing only costs time")
