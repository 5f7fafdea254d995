"""The cost model: how long each action takes.

``F``, ``B`` and ``W`` are per microbatch for one rank's whole share of the model (the Zero
Bubble paper's convention), so a rank holding ``k`` stages pays ``F/k`` per stage forward. ``B``
is the input-gradient backward (action ``I``); a full backward (action ``B``) costs ``B + W``,
or ``full_backward`` where given: one fused pass need not cost what its two halves cost apart
(on CPU ranks 1F1B measured 0.97-1.02x ZB-H1's step where B + W priced it 1.06-1.13x; a
profile measures it: :mod:`pipesched.training.profile`).
``comm`` is a latency on every dependency that crosses ranks; it does not occupy either rank.
``stage_overhead`` is the part of every ``F``, ``I`` and ``B`` that does not shrink with a stage's
share of the layers (receiving and sending its boundary, building its autograd graph, the
engine's bookkeeping): a stage holding ``1/k`` of a rank's share runs ``F`` in
``stage_overhead + (F - stage_overhead) / k``, so a rank with ``k`` stages pays it ``k`` times per
microbatch. ``F``, ``B`` and ``W`` are what the share costs as one stage, ``stage_overhead``
included, so a schedule with one stage per rank is the same with it or without; 0 (the default)
divides them evenly. (With stage multipliers ``m``: ``F m / k + stage_overhead (1 - 1/k)``.)
``W`` moves no boundary and has none. A profile (:mod:`pipesched.training.profile`) measures it
from a two-chunk layout that takes turns with its one.
``overlap`` prices an overlapped forward and backward (DualPipe's F&B): the pair takes
``max(F, B) + overlap * min(F, B)`` of its two halves' costs. 1 (the default) is what the
runtime does, one half after the other; 0 is a perfect overlap (the shorter hidden entirely);
on a GPU with the halves on two streams, measure it.

Every number has a range the planner can use (:data:`COST_RANGE`, :data:`MULTIPLIER_RANGE`):
``F``, ``B``, ``W`` and ``comm`` in any unit from nanoseconds to hours stay inside it, while a
value such as ``1e308`` would make times overflow to ``inf`` and speed-ups ``nan``.

``stage_multipliers`` describe imbalance along the model's depth (a heavy embedding or head):
a list of ``L`` factors splits the model into ``L`` equal segments. A schedule with ``S`` stages
uses it directly when ``L == S``, repeats each factor when ``L`` divides ``S`` (so the same
``p`` factors serve 1-chunk and 2-chunk schedules), and averages groups when ``S`` divides ``L``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .bounds import check_number
from .errors import ConfigError
from .execution import Program, pair_durations
from .lowering import KINDS
from .ops import COMPUTE, Op
from .placement import stages_by_rank

COST_RANGE = (1e-6, 1e9)  # F, B, W (above 0) and comm (0 allowed): at most 1e9 cost units
MULTIPLIER_RANGE = (1e-6, 1e6)  # each stage multiplier


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Costs:
    """Per-microbatch costs of one rank's share of the model, plus cross-rank latency."""

    F: float = 1.0
    B: float = 1.0
    W: float = 1.0
    comm: float = 0.0
    stage_multipliers: Optional[tuple[float, ...]] = None
    overlap: float = 1.0
    stage_overhead: float = 0.0
    full_backward: Optional[float] = None  # a fused backward's cost for a rank's share (None: B + W)

    def __post_init__(self) -> None:
        for label in ("F", "B", "W"):  # the fields' names, not action kinds (B prices an I)
            check_number(f"cost {label}", getattr(self, label), *COST_RANGE)
        check_number("comm", self.comm, 0.0, COST_RANGE[1])
        check_number("stage overhead", self.stage_overhead, 0.0, COST_RANGE[1])
        if self.stage_overhead >= min(self.F, self.B):
            raise ConfigError(
                f"stage overhead {self.stage_overhead:g} must be below F ({self.F:g}) and B ({self.B:g}): it is the part "
                "of them that does not shrink with a stage's share of the layers"
            )
        if self.full_backward is not None:
            check_number("full backward", self.full_backward, *COST_RANGE)
            if self.full_backward <= self.stage_overhead:
                raise ConfigError(f"full backward {self.full_backward:g} must be above the stage overhead "
                                  f"{self.stage_overhead:g}, a part of it")
        if not _is_number(self.overlap) or not 0 <= self.overlap <= 1:
            raise ConfigError(
                f"overlap={self.overlap!r} must be a number from 0 (an overlapped forward and "
                "backward hide the shorter entirely) to 1 (they run one after the other)"
            )
        if self.stage_multipliers is not None:
            if isinstance(self.stage_multipliers, (str, bytes)) or not all(map(_is_number, self.stage_multipliers)):
                raise ConfigError(f"stage multipliers {self.stage_multipliers!r} must be a sequence of numbers")
            mults = tuple(float(x) for x in self.stage_multipliers)
            if not mults:
                raise ConfigError("stage multipliers must hold at least one factor")
            for i, x in enumerate(mults):
                check_number(f"stage multiplier {i}", x, *MULTIPLIER_RANGE)
            object.__setattr__(self, "stage_multipliers", mults)

    @classmethod
    def parse(
        cls,
        text: Optional[str] = None,
        comm: float = 0.0,
        multipliers: Optional[Sequence[float]] = None,
        overlap: float = 1.0,
        stage_overhead: float = 0.0,
        full_backward: Optional[float] = None,
    ) -> "Costs":
        """Build from CLI text ``"F,B,W"`` (None: 1,1,1; empty text is refused)."""
        if text is None:
            f, b, w = 1.0, 1.0, 1.0
        elif not text.strip():
            raise ConfigError("--costs is empty: give three numbers F,B,W such as 1,1.4,0.6, or leave the flag out for unit costs")
        else:
            parts = [p.strip() for p in text.split(",")]
            if len(parts) != 3:
                raise ConfigError(f"--costs {text!r}: expected three numbers F,B,W such as 1,1.4,0.6")
            try:
                f, b, w = (float(p) for p in parts)
            except ValueError:
                raise ConfigError(f"--costs {text!r}: expected three numbers F,B,W such as 1,1.4,0.6") from None
        return cls(F=f, B=b, W=w, comm=comm, stage_multipliers=tuple(multipliers) if multipliers else None,
                   overlap=overlap, stage_overhead=stage_overhead, full_backward=full_backward)

    def multipliers(self, stages: int) -> list[float]:
        """One factor per stage for a schedule of ``stages`` stages (see the module docstring)."""
        mults = self.stage_multipliers
        if mults is None:
            return [1.0] * stages
        n = len(mults)
        if n == stages:
            return list(mults)
        if stages % n == 0:
            rep = stages // n
            return [mults[s // rep] for s in range(stages)]
        if n % stages == 0:
            group = n // stages
            return [sum(mults[s * group:(s + 1) * group]) / group for s in range(stages)]
        raise ConfigError(
            f"{n} stage multipliers do not fit {stages} stages: give {stages} factors, "
            f"or a number of factors that divides {stages} or that {stages} divides"
        )

    def kind_cost(self, kind: Op) -> float:
        """Cost of one action kind for a rank's whole share (B is the fused backward: B + W, or
        ``full_backward`` where given)."""
        if kind is Op.F:
            return self.F
        if kind is Op.I:
            return self.B
        if kind is Op.W:
            return self.W
        return self.B + self.W if self.full_backward is None else self.full_backward


UNIT = Costs()


def as_costs(costs: object) -> Costs:
    """``costs`` for the library's functions: None is unit costs; anything but a Costs (such as
    the text ``"1,1,1"``, which only the command line reads) is a ConfigError."""
    if costs is None:
        return UNIT
    if not isinstance(costs, Costs):
        raise ConfigError(
            f"costs must be a pipesched.Costs such as Costs(F=1, B=1.4, W=0.6) (or None for unit costs), "
            f"got {type(costs).__name__} {costs!r:.60}"
        )
    return costs


def durations_for(
    placement: tuple[int, ...], ranks: int, costs: Costs, pipelines: int = 1
) -> dict[tuple[int, Op], float]:
    """Duration of each (stage, kind) under ``costs`` for a stage-to-rank placement; with
    several pipelines every model copy's stage ``j`` takes the model's stage-``j`` multiplier;
    ``costs.stage_overhead`` is not divided among a rank's stages (see the module docstring)."""
    per_rank = [max(1, len(s)) for s in stages_by_rank(placement, ranks)]
    length = len(placement) // pipelines
    mults = costs.multipliers(length)
    fixed = {kind: 0.0 if kind is Op.W else costs.stage_overhead for kind in COMPUTE}  # W moves no boundary
    table = {}
    for s, rank in enumerate(placement):
        extra = 1 - pipelines / per_rank[rank]  # the overhead's part beyond the stage's share (0: one stage a copy)
        for kind in COMPUTE:
            table[(s, kind)] = costs.kind_cost(kind) * mults[s % length] * pipelines / per_rank[rank] + fixed[kind] * extra
    return table


def program_durations(program: Program, costs: Costs, recompute: frozenset = frozenset()) -> list[float]:
    """Duration of every action id of a lowered program (an overlapped pair's on its forward's
    id, priced by ``costs.overlap``; 0 on its backward's); a stage in ``recompute`` re-runs its
    forward at the start of its ``I`` and ``B``."""
    flat = durations_for(program.placement, len(program.rank_ids), costs, program.pipelines)
    for s in recompute:
        flat[(s, Op.I)] += flat[(s, Op.F)]
        flat[(s, Op.B)] += flat[(s, Op.F)]
    table = np.array([[flat[(s, kind)] for kind in KINDS] for s in range(len(program.placement))], np.float64)
    durations = table[program.stage, program.kind].tolist()  # array lookups: 10^5+ actions
    if program.paired:
        return pair_durations(program, durations, costs.overlap)
    return durations
