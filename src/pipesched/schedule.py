"""A pipeline schedule as data: every rank's ordered list of actions, and where each stage lives.

The schedule is global: every rank derives the same object, so every rank knows what every other
rank does and in which order. It round-trips torch.distributed.pipelining's compute-only CSV
(one row per rank, one action per cell, an empty cell for an idle slot), so schedules move both
ways between pipesched and torch/torchtitan.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Iterator, Optional, Sequence

from .actions import Action, Overlap, parse_slot, sub_actions
from .actions import Slot as Entry
from .errors import CSVFormatError
from .ops import Op
from .execution import Program, lower
from .pipelines import infer_pipelines, pipeline_block
from .placement import placement_style, stages_by_rank

Slot = Optional[Entry]  # an action, an overlapped pair, or None for an idle slot
BYTE_ORDER_MARK = "\ufeff"


def csv_rows(text: str) -> list[list[str]]:
    """The cells of a schedule CSV's rows, of either format: a leading byte-order mark ignored,
    rows ending in LF, CRLF or a lone CR (old Mac Excel); a row csv cannot read (a cell over its
    field limit of 131,072 characters, a stray quote) is a CSVFormatError naming the row."""
    text = text.removeprefix(BYTE_ORDER_MARK).replace("\r\n", "\n").replace("\r", "\n")
    reader = csv.reader(io.StringIO(text))
    try:
        return list(reader)
    except csv.Error as err:
        raise CSVFormatError(f"row {reader.line_num}: not a CSV row torch reads ({err})") from None


@dataclass(frozen=True)
class Schedule:
    """Per-rank program order plus the stage-to-rank placement.

    ``orders[r]`` is rank ``r``'s program: actions run in this order, ``None`` marks an idle
    slot (kept only so that CSVs written by torch round-trip exactly; it costs no time). An
    :class:`~pipesched.actions.Overlap` entry runs a forward and a backward together.

    ``pipelines`` > 1 (DualPipe: 2) cuts the stages into that many consecutive runs of equal
    length, each a whole copy of the model that is its own pipeline: the first stage of a run
    takes fresh inputs, its last computes the loss, and each run processes its own contiguous
    block of the microbatches (:meth:`stage_microbatches`), so microbatch numbers stay unique.
    torch's CSV has no field for it: :meth:`from_csv` reads it from which microbatches each
    stage runs (:func:`~pipesched.pipelines.infer_pipelines`).

    ``meta`` is the user's: who built the schedule and how (zb-auto's origin, interleaving's
    group). ``gathers`` (None: the lowering's window) places each rank's FSDP ``UNSHARD`` and
    ``RESHARD`` as ``(entry, op, stage)``: issued before the rank's ``entry``-th compute entry
    (idle slots not counted; the entry count: after the last), as a ``compute_comms`` CSV or
    :mod:`~pipesched.runtime.program.planned_gathers` placed them; it belongs to ``orders`` and is
    neither compared nor hashed. Data derived from the programs (:attr:`program`, :attr:`derived`) lives in cached
    properties instead: they belong to this object alone, so a schedule made from another one
    (``dataclasses.replace``, or ``Schedule(..., meta=other.meta)`` with new orders) derives its
    own and never carries a stale copy.
    """

    ranks: int
    microbatches: int
    placement: tuple[int, ...]
    orders: tuple[tuple[Slot, ...], ...]
    name: str = "custom"
    pipelines: int = 1
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    gathers: Optional[tuple[tuple[tuple[int, Op, int], ...], ...]] = field(default=None, compare=False, hash=False)

    @property
    def stages(self) -> int:
        return len(self.placement)

    @property
    def pipeline_length(self) -> int:
        """Stages per pipeline (all of them unless the schedule runs several model copies)."""
        return self.stages // self.pipelines

    def model_stage(self, stage: int) -> int:
        """The stage of the model (of one copy) that ``stage`` runs: itself with one pipeline."""
        return stage % self.pipeline_length

    def stage_microbatches(self, stage: int) -> range:
        """The microbatches ``stage`` runs: all, or its pipeline's block (:func:`pipeline_block`)."""
        return pipeline_block(stage // self.pipeline_length, self.microbatches, self.pipelines)

    @property
    def chunks(self) -> int:
        """Stages per rank (the largest, if ranks hold different numbers of stages)."""
        return max(len(s) for s in stages_by_rank(self.placement, self.ranks))

    @property
    def style(self) -> str:
        """``"loop"``, ``"v"`` or ``"custom"``."""
        return placement_style(self.placement, self.ranks)

    @cached_property
    def program(self) -> Program:
        """The programs lowered to ids for the execution model (computed once per object)."""
        return lower([self.rank_entries(r) for r in range(self.ranks)], self.placement, self.pipelines)

    @cached_property
    def derived(self) -> dict:
        """What the layers above computed from this object's programs, to compute it only once
        (:mod:`pipesched.validate` keeps its verdict here). Never copied to another schedule."""
        return {}

    def renamed(self, name: str) -> "Schedule":
        """The same programs under ``name``, without ``meta``. Where this one has no ``meta``
        either, the copy shares what was derived from the programs (the lowering, the runs, the
        validator's verdict): they describe the same orders, read the same (no) recomputation,
        and differ only in name, so computing them again would give the same values."""
        copy = Schedule(self.ranks, self.microbatches, self.placement, self.orders, name=name, pipelines=self.pipelines)
        for key in ("program", "derived"):
            if key in self.__dict__ and not self.meta:
                copy.__dict__[key] = self.__dict__[key]
        return copy

    def __getstate__(self) -> dict:
        """Pickles and copies carry the fields only: the receiver derives its own program."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def rank_entries(self, rank: int) -> list[Entry]:
        """Rank ``rank``'s program entries (actions and overlapped pairs), idle slots dropped."""
        return [a for a in self.orders[rank] if a is not None]

    def rank_actions(self, rank: int) -> list[Action]:
        """Rank ``rank``'s plain actions in program order (an overlapped pair's forward, then
        its backward), idle slots dropped."""
        return [a for entry in self.rank_entries(rank) for a in sub_actions(entry)]

    def actions(self) -> Iterator[tuple[int, Action]]:
        """Every (rank, action) pair, rank by rank in program order."""
        for rank in range(self.ranks):
            for action in self.rank_actions(rank):
                yield rank, action

    @property
    def overlapped(self) -> bool:
        """True when some rank runs an overlapped forward and backward (OVERLAP_F_B)."""
        return any(isinstance(a, Overlap) for order in self.orders for a in order)

    @property
    def split_backward(self) -> bool:
        """True when the schedule uses I/W (split backward) anywhere."""
        return any(a.kind is Op.I or a.kind is Op.W for _, a in self.actions())

    def __len__(self) -> int:
        return sum(1 for _ in self.actions())

    def describe(self) -> str:
        """One line: name, ranks, stages, chunks, microbatches, placement."""
        copies = f" pipelines={self.pipelines}" if self.pipelines > 1 else ""
        return (
            f"{self.name}: ranks={self.ranks} microbatches={self.microbatches} "
            f"stages={self.stages} chunks={self.chunks} placement={self.style}{copies}"
        )

    # -- torch's compute-only CSV -------------------------------------------------------------

    def to_csv(self) -> str:
        """torch's compute-only CSV text: one row per rank, written as torch's csv.writer does."""
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        for order in self.orders:
            writer.writerow(["" if a is None else str(a) for a in order])
        return buffer.getvalue()

    @classmethod
    def from_csv(cls, text: str, name: str = "csv", pipelines: Optional[int] = None) -> "Schedule":
        """Parse torch's compute-only CSV; placement is inferred from which row holds a stage,
        and the pipelines (model copies) from which microbatches each stage runs, unless
        ``pipelines`` says it.

        A leading byte-order mark (U+FEFF, as Excel and some Windows tools write) is ignored;
        rows may end in LF, CRLF or a lone CR (Excel on a Mac).
        """
        rows = csv_rows(text)
        while rows and not any(cell.strip() for cell in rows[-1]):
            rows.pop()
        if not rows:
            raise CSVFormatError("the schedule CSV is empty: expected one row of actions per rank")
        orders = [_parse_row(row, r) for r, row in enumerate(rows)]
        return cls.from_orders(orders, name=name, pipelines=pipelines)

    @classmethod
    def from_orders(
        cls, orders: Sequence[Sequence[Slot]], name: str = "custom", pipelines: Optional[int] = None
    ) -> "Schedule":
        """Build from per-rank action lists, inferring placement, microbatch count and (unless
        given) the number of pipelines."""
        stage_rank: dict[int, int] = {}
        stage_runs: dict[int, set[int]] = {}
        most_mb = -1
        for rank, order in enumerate(orders):
            for action in (a for entry in order if entry is not None for a in sub_actions(entry)):
                held = stage_rank.setdefault(action.stage, rank)
                if held != rank:
                    raise CSVFormatError(
                        f"stage {action.stage} appears on rank {held} and on rank {rank} "
                        f"(action {action}): each stage must live on one rank"
                    )
                stage_runs.setdefault(action.stage, set()).add(action.microbatch)
                most_mb = max(most_mb, action.microbatch)
        if not stage_rank:
            raise CSVFormatError("the schedule holds no actions")
        stages = max(stage_rank) + 1
        if len(stage_rank) < stages:
            raise CSVFormatError(
                f"stages {_gaps(stage_rank, stages)} have no actions, but stage {stages - 1} does: "
                "stages must be numbered 0..S-1 without gaps"
            )
        actions = sum(len(order) for order in orders)
        if most_mb >= actions:  # each microbatch has a forward at least: the numbers have gaps
            raise CSVFormatError(
                f"microbatch {most_mb} is run, but the schedule holds only {actions} actions: "
                "microbatches must be numbered 0..M-1 without gaps"
            )
        placement = tuple(stage_rank[s] for s in range(stages))
        if pipelines is None:
            pipelines = infer_pipelines([frozenset(stage_runs[s]) for s in range(stages)], most_mb + 1)
        return cls(
            ranks=len(orders),
            microbatches=most_mb + 1,
            placement=placement,
            orders=tuple(tuple(o) for o in orders),
            name=name,
            pipelines=pipelines,
        )


def _gaps(present, count: int, most: int = 3) -> str:
    """The numbers in 0..count-1 missing from ``present``, as at most ``most`` ranges (``1..9``)."""
    gaps, expected = [], 0
    for number in sorted(present):
        if number > expected:
            gaps.append(str(expected) if number == expected + 1 else f"{expected}..{number - 1}")
        expected = number + 1
    more = f" and {len(gaps) - most} more ranges" if len(gaps) > most else ""
    return ", ".join(gaps[:most]) + more


def _parse_row(row: list[str], rank: int) -> list[Slot]:
    slots: list[Slot] = []
    for col, cell in enumerate(row):
        if not cell.strip():
            slots.append(None)
            continue
        try:
            slots.append(parse_slot(cell))
        except CSVFormatError as err:
            raise CSVFormatError(f"row {rank + 1} (rank {rank}), cell {col + 1}: {err}") from None
    return slots
