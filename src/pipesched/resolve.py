"""Which schedule a run trains: ``none``, a registered name, ``auto``, ``zb-auto`` or a CSV file.

One place for ``pipesched train`` and the Python API (:func:`resolve_schedule`): a name is built
for the ranks and microbatches, a CSV (either of torch's formats: :mod:`pipesched.schedule_files`)
is read and validated, ``none`` is the single-process reference (no schedule). ``auto`` and
``zb-auto`` measure the model first: a short ZB-H1 profile on local ranks
(:mod:`pipesched.training.profile`), in the run's dtype and with its timeout (bf16 halves the
activation bytes an advisor or a byte limit sees, and changes the times). ``auto`` then lets
the advisor choose; ``zb-auto`` plans for the measured costs (or given ones) and sizes
(:mod:`pipesched.zb_auto_plan`). The stages to recompute come with the schedule: the run's
``recompute`` when given, else what the schedule chose (zb-auto under a memory limit, auto's
advice).

Importing this module needs no torch; only a profile does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from .bounds import DEFAULT_TIMEOUT_S
from .costs import Costs
from .errors import ConfigError
from .memory import Recomputed, format_bytes, schedule_recompute
from .registry import build_schedule
from .schedule import Schedule
from .schedule_files import load_csv_file
from .validate import validate
from .zb_auto_plan import (
    Say,
    chunks_for_model,
    on_stderr,
    wants_profile,
    zb_auto_inputs,
    zb_auto_profile,
)

if TYPE_CHECKING:
    from .training.profile import Profile

DEFAULT_MICROBATCHES = 8
MEASURING = ("auto", "zb-auto")


@dataclass(frozen=True)
class ScheduleChoice:
    """What the user names: ``name`` (a registered schedule, ``none``, ``auto`` or ``zb-auto``)
    or ``csv``, and what shapes it. ``memory_limit`` is in M_B, ``limit_bytes`` in bytes (only
    ``auto`` and ``zb-auto``, which measure the bytes); ``costs``: zb-auto plans with these
    instead of measuring them; ``recompute``: the stages to recompute (anything
    :meth:`~pipesched.memory.Recomputed.parse` takes: ``all``, ``none``, ``0,2``), None to take
    the schedule's own choice."""

    name: str = "1f1b"
    ranks: int = 2
    microbatches: Optional[int] = None  # default 8; a CSV brings its own
    chunks: Optional[int] = None
    csv: Optional[Path] = None
    memory_limit: Optional[float] = None
    limit_bytes: Optional[float] = None
    recompute_input: Optional[float] = None
    costs: Optional[Costs] = None
    recompute: Optional[Recomputed] = None

    def __post_init__(self) -> None:
        if self.recompute is not None:  # a malformed list is refused before anything is built
            object.__setattr__(self, "recompute", Recomputed.parse(self.recompute))
        if self.limit_bytes is not None and self.measures is None:
            raise ConfigError(
                f"--activation-limit {format_bytes(self.limit_bytes)}: a size in bytes needs --schedule auto or zb-auto "
                "(they measure the activations); with another schedule give --memory-limit in M_B units, e.g. --memory-limit 2"
            )

    @property
    def measures(self) -> Optional[str]:
        """``"auto"`` or ``"zb-auto"`` when the schedule is made from the measured model, else None."""
        name = self.name.strip().lower()
        return name if self.csv is None and name in MEASURING else None

    def profiles(self) -> bool:
        """Whether resolving runs a profile (auto always; zb-auto unless given costs suffice)."""
        if self.measures == "auto":
            return True
        return self.measures == "zb-auto" and wants_profile(self.costs, self.memory_limit, self.limit_bytes,
                                                            self.recompute_input)


@dataclass(frozen=True)
class RunSpec:
    """What a profile needs of the run: the model, one replica's batch, seed, dtype and timeout."""

    model: str
    batch_size: int
    seed: int = 0
    dtype: str = "fp32"
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class Resolved:
    """The schedule (None: the single-process reference), the stages to recompute (checked
    against the schedule's), and the profile it was made from (None when nothing was measured)."""

    schedule: Optional[Schedule]
    recompute: Recomputed
    profile: Optional["Profile"] = None


def resolve_schedule(choice: ScheduleChoice, run: Optional[RunSpec] = None, say: Say = on_stderr) -> Resolved:
    """The schedule ``choice`` names; ``auto`` and ``zb-auto`` measure ``run`` first (a
    ConfigError without it). What was measured and chosen is said through ``say``."""
    if choice.measures is None:
        schedule = named_schedule(choice)
        return Resolved(schedule, recompute_of(schedule, choice.recompute, say))
    if run is None:
        raise ConfigError(f"--schedule {choice.measures} measures the model first: give the run (model, batch size)")
    if choice.measures == "auto":
        return _auto(choice, run, say)
    return _zb_auto(choice, run, say)


def named_schedule(choice: ScheduleChoice) -> Optional[Schedule]:
    """A registered schedule built for ``choice``, a CSV file read and validated, or None for
    ``none``; needs no measurement (and no torch)."""
    if choice.csv is not None:
        loaded = validate(load_csv_file(choice.csv, choice.ranks))
        if choice.microbatches is not None and choice.microbatches != loaded.microbatches:
            raise ConfigError(f"{choice.csv} has {loaded.microbatches} microbatches but --microbatches is {choice.microbatches}")
        return loaded
    if choice.name.strip().lower() == "none":
        return None
    return build_schedule(choice.name, choice.ranks, choice.microbatches or DEFAULT_MICROBATCHES, choice.chunks,
                          memory_limit=choice.memory_limit, recompute_input=choice.recompute_input)


def recompute_of(schedule: Optional[Schedule], given: Optional[Recomputed], say: Say = on_stderr) -> Recomputed:
    """``given`` if any, else the stages the schedule chose to recompute (zb-auto under a memory
    limit with a recompute share), said through ``say``; checked against the schedule's stages."""
    own = schedule_recompute(schedule) if schedule is not None else None
    if given is None and own is not None:
        say(f"{schedule.name}: recomputing stages {own.spec()} to fit the memory limit "
            f"({schedule.meta.get('origin', '')}); --recompute overrides it")
    chosen = Recomputed.parse(given if given is not None or own is None else own.spec())
    if schedule is not None:
        chosen.of(schedule)  # a stage the model lacks fails here, before any process starts
    return chosen


def _auto(choice: ScheduleChoice, run: RunSpec, say: Say) -> Resolved:
    """Profile, let the advisor choose, say what it chose and why."""
    from .training.profile import auto_schedule

    schedule, advice, prof = auto_schedule(
        run.model, choice.ranks, choice.microbatches or DEFAULT_MICROBATCHES, run.batch_size, choice.memory_limit,
        run.seed, limit_bytes=choice.limit_bytes, dtype=run.dtype, timeout_s=run.timeout_s,
    )
    say(prof.summary())
    say(f"auto: {advice.reason}")
    chosen = Recomputed.parse(advice.recommended.recompute)  # the advisor's: all or none
    if choice.recompute is None and chosen:
        say("auto: recomputing every stage's activations (--recompute all) to fit")
    return Resolved(schedule, recompute_of(schedule, choice.recompute if choice.recompute is not None else chosen, say),
                    prof)


def _zb_auto(choice: ScheduleChoice, run: RunSpec, say: Say) -> Resolved:
    """zb-auto planned for the measured (or given) costs and sizes of the run's model."""
    from .training.models import get_model

    m = choice.microbatches or DEFAULT_MICROBATCHES
    prof = (zb_auto_profile(run.model, choice.ranks, m, run.batch_size, run.seed, run.dtype, run.timeout_s)
            if choice.profiles() else None)
    inputs = zb_auto_inputs(prof, choice.costs, choice.memory_limit, choice.limit_bytes, choice.recompute_input, say)
    blocks = get_model(run.model).num_blocks
    schedule = inputs.plan(choice.ranks, m, chunks_for_model(choice.chunks, choice.ranks, blocks), say)
    return Resolved(schedule, recompute_of(schedule, choice.recompute, say), prof)
