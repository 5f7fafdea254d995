"""Options shared by every command that builds a schedule (the flags of DESIGN.md).

The planning options (ranks, microbatches, chunks, costs, comm, stage overhead, full backward,
memory limit, stage multipliers, overlap, objective, recompute input) are declared once, in
:data:`PLANNING_OPTIONS`, and checked once, in :func:`setup`: a command decorated with :func:`planning_options` takes one
``plan: PlanningFlags`` parameter in their place and calls ``plan.setup()``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Optional

import typer

from ..bounds import check_number, number_list
from ..costs import Costs
from ..environment import local_cores
from ..errors import ConfigError
from ..memory_limits import MAX_LIMIT_MB, moved_size, parse_memory_limit, size_limit, units_only
from ..shared_options import CHUNKS, RANKS, RECOMPUTE_INPUT, check_recompute_input
from .declared import typer_option
from .memory_limits import MemoryLimit
from .option_group import option_group

ScheduleName = typer.Argument(None, help="Schedule name (or give --csv).")
ScheduleCsv = typer.Option(None, "--csv", help="A schedule CSV (torch's compute_only or compute_comms format) instead of a name.")
Ranks = typer_option(RANKS)
Microbatches = typer.Option(8, "--microbatches", "-m", help="Microbatches per iteration, m.")
Chunks = typer_option(CHUNKS)
CostsOpt = typer.Option(None, "--costs", help="Per-microbatch costs F,B,W of one rank's share, e.g. 1,1.4,0.6.")
Comm = typer.Option(0.0, "--comm", help="Latency of every cross-rank transfer, in cost units.")
StageOverhead = typer.Option(
    0.0, "--stage-overhead",
    help="The part of every F, I and B that does not shrink with a stage's share of the layers "
    "(host work per stage: boundary, autograd, bookkeeping), in cost units; a rank with v chunks "
    "pays it v times. advise --profile measures it.",
)
FullBackward = typer.Option(
    None, "--full-backward",
    help="What a fused backward (action B, as in 1f1b) of a rank's share costs, in cost units "
    "(default B+W of --costs). advise --profile measures it.",
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
RecomputeInput = typer_option(RECOMPUTE_INPUT)
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


def parse_multipliers(text: Optional[str]) -> Optional[tuple[float, ...]]:
    """``--stage-multipliers 1.3,1,1,1.3`` as numbers (None when not given; empty is refused)."""
    return None if text is None else number_list("--stage-multipliers", text, "factors such as 1.3,1,1,1.3")


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
    bytes_per_mb: Optional[float] = None,
    stage_overhead: float = 0.0,
    full_backward: Optional[float] = None,
    activation_limit: Optional[str] = None,
    command: str = "simulate",
) -> Setup:
    """Check and bundle the shared flags (bad values raise ConfigError: one line, exit 2).

    ``bytes_per_mb`` (one microbatch's activations, where ``command`` knows it) lets
    ``activation_limit`` (``--activation-limit``, bytes) limit the activations, converted to M_B."""
    if ranks < 1:
        raise ConfigError(f"--ranks must be at least 1, got {ranks}")
    if microbatches < 1:
        raise ConfigError(f"--microbatches must be at least 1, got {microbatches}")
    if chunks is not None and chunks < 1:
        raise ConfigError(f"--chunks must be at least 1, got {chunks}")
    limit = _activation_limit(memory_limit, activation_limit, bytes_per_mb, command)
    if objective is not None:
        from ..schedules.choose import check_objective

        check_objective(objective)
    if recompute_input is not None:
        check_recompute_input(recompute_input, limit)
    parsed = Costs.parse(costs, comm=comm, multipliers=parse_multipliers(multipliers), overlap=overlap,
                         stage_overhead=stage_overhead, full_backward=full_backward)
    return Setup(ranks, microbatches, chunks, parsed, limit, objective, recompute_input)


def _activation_limit(memory_limit: Optional[str], activation_limit: Optional[str], bytes_per_mb: Optional[float],
                      command: str) -> Optional[float]:
    """The activations' limit in M_B, from ``--memory-limit`` or (sizes known) ``--activation-limit``."""
    if bytes_per_mb is None:
        if activation_limit is not None:
            raise ConfigError(f"--activation-limit needs the activation size per microbatch ({command} "
                              "--activation-bytes); here give --memory-limit in M_B units, e.g. --memory-limit 4")
        return units_only(memory_limit, f"a size in bytes is --activation-limit, which needs the activation size "
                          f"({command} --activation-bytes)")
    if parse_memory_limit(memory_limit)[1] is not None:  # a size: the old spelling of --activation-limit
        activation_limit, memory_limit = moved_size(command, memory_limit, "--activation-limit", activation_limit), None
    if memory_limit is not None and activation_limit is not None:
        raise ConfigError("--memory-limit and --activation-limit both limit the activations: give one")
    if activation_limit is None:
        return units_only(memory_limit, "")
    return min(size_limit("--activation-limit", activation_limit) / bytes_per_mb, MAX_LIMIT_MB)  # more: no limit


@dataclass(frozen=True)
class PlanningFlags:
    """The planning options as typed, before :meth:`setup` checks them."""

    ranks: int = 4
    microbatches: int = 8
    chunks: Optional[int] = None
    costs: Optional[str] = None
    comm: float = 0.0
    stage_overhead: float = 0.0
    full_backward: Optional[float] = None
    memory_limit: Optional[str] = None
    stage_multipliers: Optional[str] = None
    overlap: float = 1.0
    objective: Optional[str] = None
    recompute_input: Optional[float] = None
    name: Optional[str] = None  # with the schedule's source: a registered name, or
    csv: Optional[Path] = None  # a CSV file (one of the two)

    def setup(self, bytes_per_mb: Optional[float] = None, activation_limit: Optional[str] = None,
              command: str = "simulate") -> Setup:
        """The checked :class:`Setup` (ConfigError on a bad value); ``activation_limit`` in bytes
        needs ``bytes_per_mb``, which ``command`` knows."""
        return setup(self.ranks, self.microbatches, self.chunks, self.costs, self.comm, self.memory_limit,
                     self.stage_multipliers, self.objective, self.overlap, self.recompute_input, bytes_per_mb,
                     self.stage_overhead, self.full_backward, activation_limit, command)


# each planning option: (parameter, type, typer's declaration), in the order --help lists them
PLANNING_OPTIONS: tuple[tuple[str, object, object], ...] = (
    ("ranks", int, Ranks), ("microbatches", int, Microbatches), ("chunks", Optional[int], Chunks),
    ("costs", Optional[str], CostsOpt), ("comm", float, Comm), ("stage_overhead", float, StageOverhead),
    ("full_backward", Optional[float], FullBackward), ("memory_limit", Optional[str], MemoryLimit),
    ("stage_multipliers", Optional[str], Multipliers), ("overlap", float, Overlap),
    ("objective", Optional[str], Objective), ("recompute_input", Optional[float], RecomputeInput),
)
# the schedule's source, for commands that take a name or a CSV: the argument, then the option
SOURCE_OPTIONS = (("name", Optional[str], ScheduleName), ("csv", Optional[Path], ScheduleCsv))
assert [name for name, _, _ in PLANNING_OPTIONS + SOURCE_OPTIONS] == [f.name for f in fields(PlanningFlags)]


def planning_options(*, without: tuple[str, ...] = (), source: bool = False) -> Callable[[Callable], Callable]:
    """Give a typer command the planning options in place of its ``plan: PlanningFlags``
    parameter (``without`` names options the command does not take, e.g. ``("overlap",)``);
    ``source``: also the schedule's name argument and ``--csv`` (``plan.name``, ``plan.csv``)."""
    declared_here = (SOURCE_OPTIONS[:1] if source else ()) + PLANNING_OPTIONS + (SOURCE_OPTIONS[1:] if source else ())
    return option_group("plan", PlanningFlags, tuple(d for d in declared_here if d[0] not in without))


# flag -> (least, most) for the numbers that size work or enter the cost model and have no
# range of their own elsewhere: the search is bounded by these, not only by the memory it exhausts
RANGES: dict[str, tuple[float, float]] = {
    "--max-chunks": (1, 16), "--layers": (1, 100_000), "--hidden": (1, 2**20), "--seq-len": (1, 2**24),
    "--heads": (1, 2**16), "--vocab": (1, 2**24), "--gpus": (1, 2**16), "--global-batch": (1, 2**24),
    "--microbatch-size": (1, 2**24), "--max-microbatches": (1, 2**24), "--min-microbatch-size": (1, 2**24),
    "--top": (1, 10_000), "--batch-size": (1, 2**24), "--profile-steps": (1, 10_000),
    "--gpu-memory": (1e-3, 1e6), "--bandwidth": (1e-6, 1e9), "--flops": (1e-6, 1e9),
    "--dp-bandwidth": (1e-6, 1e9), "--dp-latency": (0.0, 1e9), "--overhead": (0.0, 1e9),
    "--gpus-per-node": (1, 2**16), "--node-bandwidth": (1e-6, 1e9), "--tp": (1, 2**16), "--dp-shard": (1, 2**16),
    "--dp": (1, 2**16), "--ep": (1, 2**16), "--experts": (1, 2**16), "--experts-per-token": (1, 2**16),
    "--expert-hidden": (1, 2**20), "--shared-experts": (0, 2**16), "--dense-layers": (0, 100_000),
}


def check_ranges(values: dict[str, object]) -> None:
    """Refuse in one line (ConfigError) a given value outside its flag's range (:data:`RANGES`;
    ``--workers``: 1 to the cores this process may run on); None means not given. NaN is outside every range."""
    for flag, value in values.items():
        if value is not None:
            in_range(flag)(flag, value)


def in_range(flag: str) -> Callable[[str, object], None]:
    """The check of ``flag``'s range (:func:`check_ranges`), for a value named ``label``: the flag,
    or the key and file a ``--config`` file gave it in."""
    low, high = (1, local_cores()) if flag == "--workers" else RANGES[flag]
    return lambda label, value: check_number(label, value, low, high, whole=isinstance(low, int))


def recompute_limit(s: Setup) -> Optional[float]:
    """The memory limit when the flags have zb-auto search recomputation (what its planning
    work counts), else None."""
    return s.memory_limit if s.recompute_input is not None else None
