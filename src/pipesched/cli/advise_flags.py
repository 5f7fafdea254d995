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

from .. import memory_limits as limits
from ..errors import ConfigError
from ..registry import get_family
from . import memory_limits as ml
from . import options as opt
from .option_group import option_group

MIN_MICROBATCH_SIZE = 1  # --min-microbatch-size left out
SHRINKING_OVERHEAD = 0.0  # --overhead left out: all of F, B, W shrinks with the microbatch


@dataclass(frozen=True)
class SearchFlags:
    """The batch, the memory limit, the given costs and the search's bounds, as typed."""

    memory_limit: Optional[str]
    activation_limit: Optional[str]
    rank_memory_limit: Optional[str]
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

    def limits(self, profiled: bool, described: bool) -> tuple[Optional[float], Optional[float]]:
        """The memory limit as (M_B, bytes), at most one given: ``--activation-limit`` (bytes of
        the activations ``--profile`` measures) or ``--rank-memory-limit`` (all a GPU holds, as a
        model description counts it); a size given to ``--memory-limit`` is the old spelling of
        the one that fits (warned about)."""
        units, size = limits.parse_memory_limit(self.memory_limit)
        activation, rank = self.activation_limit, self.rank_memory_limit
        if size is not None and (profiled or described):
            new = "--activation-limit" if profiled else "--rank-memory-limit"
            moved = limits.moved_size("advise", self.memory_limit, new, activation if profiled else rank)
            activation, rank = (moved, rank) if profiled else (activation, moved)
        elif size is not None:
            limits.units_only(self.memory_limit, "sizes in bytes need --profile (--activation-limit) or a model "
                          "description (--rank-memory-limit)")
        if activation is not None and not profiled:
            raise ConfigError("--activation-limit needs --profile (it measures the activations); with a model "
                              "description give --rank-memory-limit, else --memory-limit in M_B")
        if rank is not None and (profiled or not described):
            raise ConfigError("--rank-memory-limit needs a model description (--layers, --hidden, ...: it counts "
                              "weights, gradients and optimizer state); with --profile give --activation-limit")
        given = [flag for flag, value in (("--memory-limit", units), ("--activation-limit", activation),
                                          ("--rank-memory-limit", rank)) if value is not None]
        if len(given) > 1:
            raise ConfigError(f"{' and '.join(given)} are each a memory limit: give one")
        return units, limits.size_limit("--activation-limit", activation) or limits.size_limit("--rank-memory-limit", rank)

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
    ("memory_limit", Optional[str], ml.MemoryLimit),
    ("activation_limit", Optional[str], ml.ActivationLimit),
    ("rank_memory_limit", Optional[str], ml.RankMemoryLimit),
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
    ("workers", Optional[int], typer.Option(None, "--workers", help="Processes for the search (default: the cores this process may run on).")),
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
