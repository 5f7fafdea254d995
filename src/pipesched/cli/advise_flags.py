"""``pipesched advise``'s search options, declared as groups (:func:`option_group`): what the
search is given and how far it goes (:class:`SearchFlags`), and which schedules it tries and what
it shows (:class:`ScopeFlags`). The model description and ``--profile`` are in
:mod:`pipesched.cli.advise_model`, the layout's flags in :mod:`pipesched.cli.advise_layout`.

The fields have no defaults of their own: typer's declaration below is the one place a default is
written, and a flag whose default depends on the way the costs are given is declared ``None`` (so
that a flag given is told apart from one left out) and defaults where it is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import typer

from ..errors import ConfigError
from ..registry import get_family
from . import options as opt
from .option_group import option_group

MIN_MICROBATCH_SIZE = 1  # --min-microbatch-size left out
SHRINKING_OVERHEAD = 0.0  # --overhead left out: all of F, B, W shrinks with the microbatch


@dataclass(frozen=True)
class SearchFlags:
    """The batch, the memory limit, the given costs and the search's bounds, as typed."""

    memory_limit: Optional[str]
    microbatches: Optional[int]
    global_batch: Optional[int]
    microbatch_size: Optional[int]
    costs: Optional[str]
    comm: Optional[float]
    stage_overhead: Optional[float]
    full_backward: Optional[float]
    stage_multipliers: Optional[str]
    objective: str
    max_chunks: int
    max_microbatches: Optional[int]
    min_microbatch_size: Optional[int]
    overhead: Optional[float]

    def given_costs(self) -> dict[str, object]:
        """The flags that give the costs (flag -> value; None: not given), which a model
        description or a profile gives instead, in the order a refusal names them."""
        return {"--costs": self.costs, "--comm": self.comm, "--stage-multipliers": self.stage_multipliers,
                "--stage-overhead": self.stage_overhead, "--full-backward": self.full_backward}


@dataclass(frozen=True)
class ScopeFlags:
    """Which schedules the search tries, on how many processes, and what it prints."""

    schedules: Optional[str]
    workers: Optional[int]
    top: int
    as_json: bool

    def families(self) -> Optional[list]:
        """The schedule families of ``--schedules`` (None: every registered one)."""
        if self.schedules is None:
            return None
        chosen = [get_family(n) for n in self.schedules.split(",") if n.strip()]
        if not chosen:
            raise ConfigError("--schedules needs at least one schedule name (pipesched list shows them)")
        return chosen


SEARCH_OPTIONS: tuple[tuple[str, object, object], ...] = (
    ("memory_limit", Optional[str], typer.Option(
        None, "--memory-limit",
        help="Memory per rank: in M_B, activations only (one microbatch's activations of a rank's share); "
        "or in bytes (40GiB, 512MiB) with a model description or --profile: all the advisor counts per GPU "
        "(weights, gradients, optimizer state and activations, as --gpu-memory; with --profile the measured "
        "activations), the bytes it reports as peak_memory_bytes.")),
    ("microbatches", Optional[int], typer.Option(None, "--microbatches", "-m", help="Fixed microbatch count M.")),
    ("global_batch", Optional[int], typer.Option(
        None, "--global-batch", help="Samples per iteration G: the advisor also chooses M.")),
    ("microbatch_size", Optional[int], typer.Option(
        None, "--microbatch-size", help="Samples per microbatch b that the costs describe.")),
    ("costs", Optional[str], opt.CostsOpt),
    ("comm", Optional[float], typer.Option(None, "--comm", help="Latency of every cross-rank transfer, in cost units.")),
    ("stage_overhead", Optional[float], typer.Option(None, "--stage-overhead", help=opt.StageOverhead.help)),
    ("full_backward", Optional[float], opt.FullBackward),
    ("stage_multipliers", Optional[str], opt.Multipliers),
    ("objective", str, typer.Option("makespan", "--objective", help="makespan (optimizer step syncs ranks) or span.")),
    ("max_chunks", int, typer.Option(4, "--max-chunks", help="Most chunks per rank to try.")),
    ("max_microbatches", Optional[int], typer.Option(
        None, "--max-microbatches", help="Most microbatches (default max(G/b, 8p)).")),
    ("min_microbatch_size", Optional[int], typer.Option(
        None, "--min-microbatch-size", help=f"Smallest microbatch (default {MIN_MICROBATCH_SIZE}).")),
    ("overhead", Optional[float], typer.Option(
        None, "--overhead", help="With --costs: the part of F, B, W not shrinking.")),
)
SCOPE_OPTIONS: tuple[tuple[str, object, object], ...] = (
    ("schedules", Optional[str], typer.Option(
        None, "--schedules", help="Only these schedules, comma-separated (default: all).")),
    ("workers", Optional[int], typer.Option(None, "--workers", help="Processes for the search (default: the CPUs).")),
    ("top", int, typer.Option(12, "--top", help="Rows in the table.")),
    ("as_json", bool, typer.Option(False, "--json", help="Print the candidates as a JSON list, best first.")),
)


def search_options(command):
    """Give ``pipesched advise`` the search options in place of its ``search: SearchFlags``."""
    return option_group("search", SearchFlags, SEARCH_OPTIONS)(command)


def scope_options(command):
    """Give ``pipesched advise`` the scope options in place of its ``scope: ScopeFlags``."""
    return option_group("scope", ScopeFlags, SCOPE_OPTIONS)(command)


def by_flag(flags: object, declared: tuple[tuple[str, object, object], ...]) -> dict[str, object]:
    """A group's values as typed, by their flag's long name (``--max-chunks`` -> 4): how the
    refusals, which name flags, look them up."""
    return {declaration.param_decls[0]: getattr(flags, name) for name, _, declaration in declared}


def searched(search: SearchFlags, scope: ScopeFlags, *, sizes: bool = True) -> dict:
    """The search's options for :func:`pipesched.advise.advise` and the layout searches
    (``sizes``: with the microbatch sizes' bounds, which a profile fixes)."""
    options = {"objective": search.objective, "max_chunks": search.max_chunks}
    if sizes:
        options.update(min_microbatch_size=or_default(search.min_microbatch_size, MIN_MICROBATCH_SIZE),
                       max_microbatches=search.max_microbatches)
    return {**options, "families": scope.families(), "workers": scope.workers}


def or_default(value, default):
    """A flag's value, or its default where it was not given (a flag declared None, so that a
    flag given is told apart from one left out)."""
    return default if value is None else value
