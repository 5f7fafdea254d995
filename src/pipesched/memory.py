"""The memory rules: what each action takes and frees, in M_B units or in bytes.

One place answers "how much does a rank hold after this action" for the simulator, the
runtime's prediction and the advisor. A stage's forward ``F`` keeps what its backward needs
(``keep``); a split input backward ``I`` frees all of it but what the weight backward still needs
(the W ``stash``: each Linear's input and output gradient, the Zero Bubble paper's per-layer
accounting), which ``W`` frees; a full backward ``B`` frees everything ``F`` kept. While a
backward runs it may hold more than at its start (``backward_extra``): a recomputed stage
(recomputed block by block, as the runtime does) keeps only its blocks' inputs and rebuilds one
block at a time in its backward; under a split backward the W stash of the blocks already done
builds up meanwhile, so recomputation does not shrink what ``I`` leaves for ``W``.

In M_B units (the default, sizes unknown) a stage-microbatch weighs one unit, ``I`` frees
nothing and a rank's count is divided by the stages it holds: the Zero Bubble paper's model.
Memory depends only on the order of a rank's actions, never on their times.

Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import numpy as np

from .actions import Action
from .byte_units import BYTE_UNITS, format_bytes, parse_size  # noqa: F401 - re-exported (see there)
from .errors import ConfigError
from .execution import TOLERANCE
from .lowering import KINDS, codes
from .ops import COMPUTE, Op


@dataclass(frozen=True)
class StageMemory:
    """What one microbatch of one stage holds, in any unit (bytes, or M_B).

    - ``keep``: held from the start of ``F`` to the end of its ``I`` or ``B``;
    - ``stash``: what ``I`` leaves for ``W``, held until ``W`` ends;
    - ``backward_extra``: held above the level at its start while ``I`` or ``B`` runs;
    - ``input_backward_extra``: the same for ``I`` alone, where it differs (a recomputed stage's
      ``I`` also builds up its stash while it rebuilds; DualPipe runs both ``B`` and ``I``).
    """

    keep: float
    stash: float
    backward_extra: float = 0.0
    input_backward_extra: Optional[float] = None

    def extra_during(self, kind: Op) -> float:
        """Held above the level at the start of a backward of ``kind`` (``I`` or ``B``) while it runs."""
        if kind is Op.I and self.input_backward_extra is not None:
            return self.input_backward_extra
        return self.backward_extra

    def recomputed(self, input_size: float, blocks: int = 1) -> "StageMemory":
        """The same stage, of ``blocks`` blocks of equal size, each recomputed on its own: ``F``
        keeps only the blocks' inputs (``input_size`` each); the backward rebuilds one block at a
        time, last first, adding one block's activations less its input. A ``B`` holds the most
        while the first block rebuilds; an ``I`` also keeps each finished block's W stash while
        that block's input goes, so it holds the most at the last block."""
        block, block_stash = self.keep / blocks, self.stash / blocks
        rebuilt = max(block - input_size, 0.0) + self.backward_extra
        stash_growth = (blocks - 1) * max(block_stash - input_size, 0.0)
        return StageMemory(blocks * input_size, self.stash, rebuilt, stash_growth + rebuilt)


UNIT_STAGE = StageMemory(keep=1, stash=1)  # M_B: I frees nothing of what F kept


def level_after(kind: Op, size: StageMemory) -> float:
    """How the held amount changes over one action of ``kind`` on a stage of ``size``."""
    if kind is Op.F:
        return size.keep
    if kind is Op.I:
        return size.stash - size.keep
    if kind is Op.W:
        return -size.stash
    return -size.keep  # B


UNIT_CHANGE = {kind: level_after(kind, UNIT_STAGE) for kind in COMPUTE}  # M_B: F takes one, W frees it


def _steps(size: StageMemory) -> dict[Op, tuple[float, float]]:
    """Per kind of pass on a stage of ``size``: (held above the level at its start while it
    runs, change over it); asked once per stage, not once per action."""
    return {kind: (size.extra_during(kind) if kind.is_backward else 0.0, level_after(kind, size)) for kind in COMPUTE}


def levels(actions: Sequence[Action], sizes: Sequence[StageMemory]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each action of one rank in program order, as arrays: its kind (numbered as in
    :data:`~pipesched.lowering.KINDS`), the highest held while it runs, and the held after it."""
    stage, kind = codes(actions)
    return (kind, *_levels(*_steps_of(stage, kind, sizes)))


def peak(actions: Sequence[Action], sizes: Sequence[StageMemory]) -> float:
    """Peak held over one rank's actions in program order (0 for a rank with none)."""
    return rank_peaks(*codes(actions), (range(len(actions)),), sizes)[0]


def rank_peaks(stage: np.ndarray, kind: np.ndarray, rank_ids: Sequence[range],
               sizes: Sequence[StageMemory]) -> list[float]:
    """Each rank's peak held (0 for a rank with none), from the stages and kinds of a lowered
    program's actions (:func:`codes`) and each rank's ids (consecutive, in program order)."""
    extra, change = _steps_of(stage, kind, sizes)
    return [float(_levels(extra[ids.start:ids.stop], change[ids.start:ids.stop])[0].max()) if ids else 0.0
            for ids in rank_ids]


def _steps_of(stage: np.ndarray, kind: np.ndarray, sizes: Sequence[StageMemory]) -> tuple[np.ndarray, np.ndarray]:
    """Per action, :func:`_steps`' (held above the level at its start, change): a table of the
    stages named, asked once per stage, indexed by array (a Python step per action cost seconds)."""
    named, row = np.unique(stage, return_inverse=True)
    table = np.array([[_steps(sizes[s])[k] for k in KINDS] for s in named.tolist()], np.float64).reshape(-1, len(KINDS), 2)
    return table[row, kind, 0], table[row, kind, 1]


def _levels(extra: np.ndarray, change: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(highest held while it runs, held after) per action: the changes summed one after the
    other from 0 (``cumsum`` adds in order, as a loop would: the same floats)."""
    held = np.cumsum(np.concatenate(([0.0], change)))
    during, after = held[:-1] + extra, held[1:]
    return np.where(after > during, after, during), after


class _Table:
    """Per-stage sizes: the stages named, and one size for every other."""

    def __init__(self, named: dict, other: StageMemory) -> None:
        self.named, self.other = named, other

    def __getitem__(self, stage: int) -> StageMemory:
        return self.named.get(stage, self.other)


def unit_sizes(stages_on_rank: float, recompute: Optional["Recompute"] = None) -> _Table:
    """M_B sizes on a rank holding ``stages_on_rank`` stages: each stage a share of one unit
    (a stage that ``recompute`` names keeping only its input's share of it)."""
    share = 1.0 / stages_on_rank
    stored = StageMemory(keep=share, stash=share)
    named = {} if recompute is None else {s: stored.recomputed(share * recompute.input_share) for s in recompute.stages}
    return _Table(named, stored)


def unit_peak(actions: Sequence[Action], stages_on_rank: float, recompute: Optional["Recompute"] = None) -> float:
    """Peak in M_B: stage-microbatches held at once (counted whole), each a ``1/stages_on_rank``
    share; a stage that ``recompute`` names keeps only its input's share until its backward."""
    return unit_rank_peaks(*codes(actions), (range(len(actions)),), (stages_on_rank,), recompute)[0]


def unit_rank_peaks(stage: np.ndarray, kind: np.ndarray, rank_ids: Sequence[range], stages_on_rank: Sequence[float],
                    recompute: Optional["Recompute"] = None) -> list[float]:
    """:func:`unit_peak` of every rank of a lowered program (as :func:`rank_peaks` takes it)."""
    whole = rank_peaks(stage, kind, rank_ids, unit_sizes(1.0, recompute))
    return [held / k for held, k in zip(whole, stages_on_rank)]


def whole_stage_microbatches(limit: float, stages_on_rank: int) -> int:
    """How many stage-microbatches a rank holding ``stages_on_rank`` stages may keep at once
    within ``limit`` M_B (each weighs ``1/stages_on_rank``; float noise never costs one)."""
    return int(limit * stages_on_rank + TOLERANCE)


@dataclass(frozen=True)
class Recompute:
    """Which stages of a schedule recompute their activations, in M_B terms.

    ``input_share``: what a recomputed stage-microbatch keeps between its forward and its
    backward (the stage's input), as a share of what a stored one keeps. The backward rebuilds
    the rest first and, split, leaves the whole W stash as a stored stage's ``I`` does.
    A schedule carries it in ``meta["recompute"]`` (zb-auto's choice); the simulator then
    prices its ``I``/``B`` with the forward again and counts its memory this way.
    """

    stages: frozenset
    input_share: float

    def __post_init__(self) -> None:
        if not 0 <= self.input_share < 1:
            raise ConfigError(
                f"a recomputed stage's input share must be from 0 to below 1 (what it keeps of its "
                f"activations), got {self.input_share!r}"
            )
        object.__setattr__(self, "stages", frozenset(self.stages))

    def spec(self) -> str:
        """The stages as ``--recompute`` takes them (``0,2``; ``none`` when empty)."""
        return str(Recomputed(self.stages))


def schedule_recompute(schedule) -> Optional[Recompute]:
    """The recomputation a schedule carries (``meta["recompute"]``), or None."""
    chosen = schedule.meta.get("recompute")
    return chosen if isinstance(chosen, Recompute) and chosen.stages else None


@dataclass(frozen=True)
class MemorySizes:
    """Per-stage sizes in bytes: a stored stage's, and for recomputation its blocks' input's and
    how many blocks it has (``blocks``; default one per stage: the whole stage recomputed at once).

    ``recompute`` names the stages whose activations are recomputed in the backward."""

    stages: tuple[StageMemory, ...]
    inputs: tuple[float, ...]
    recompute: frozenset = frozenset()
    blocks: Optional[tuple[int, ...]] = None

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.stages):
            raise ValueError(f"{len(self.stages)} stage sizes but {len(self.inputs)} input sizes")
        if self.blocks is not None and len(self.blocks) != len(self.stages):
            raise ValueError(f"{len(self.stages)} stage sizes but {len(self.blocks)} block counts")

    def effective(self) -> tuple[StageMemory, ...]:
        """The sizes the rules use: recomputed stages keep only their blocks' inputs."""
        blocks = self.blocks or (1,) * len(self.stages)
        return tuple(
            size.recomputed(self.inputs[s], max(blocks[s], 1)) if s in self.recompute else size
            for s, size in enumerate(self.stages)
        )

    def with_recompute(self, stages) -> "MemorySizes":
        return replace(self, recompute=frozenset(stages))

    def recompute_share(self) -> float:
        """What a recomputed stage's ``F`` keeps (its blocks' inputs) as a share of what the stored
        stage's keeps: :class:`Recompute`'s ``input_share`` for these sizes. The M_B model weighs
        every stage alike, so one share serves them all: the largest (the least a stage saves)."""
        blocks = self.blocks or (1,) * len(self.stages)
        return max(size.recomputed(self.inputs[s], max(blocks[s], 1)).keep / size.keep
                   for s, size in enumerate(self.stages) if size.keep > 0)


@dataclass(frozen=True)
class Recomputed:
    """Which of the model's stages recompute their activations in the backward: every one
    (``stages`` None, written ``all``), none (``none``) or some (``0,2``). The one form a
    choice takes from the command line or the Python API (a string, indices, or this) to a
    schedule's stages (:meth:`of`); model stages, so that DualPipe's named stages recompute
    in both copies."""

    stages: Optional[frozenset] = frozenset()

    @classmethod
    def parse(cls, spec) -> "Recomputed":
        """``"all"``, ``"none"`` / None / ``""``, ``"0,2"``, indices, or a Recomputed as it is;
        anything else is a ConfigError naming what is valid."""
        if isinstance(spec, Recomputed):
            return spec
        if spec is None:
            return cls()
        if isinstance(spec, str):
            text = spec.strip().lower()
            if text in ("", "none", "all"):
                return cls(None if text == "all" else frozenset())
            try:
                spec = [int(part) for part in text.split(",")]
            except ValueError:
                raise ConfigError(f"recompute {spec!r}: give all, none, or stage indices such as 0,2") from None
        return cls(frozenset(int(s) for s in spec))

    def __str__(self) -> str:
        return "all" if self.stages is None else ",".join(map(str, sorted(self.stages))) or "none"

    def __bool__(self) -> bool:
        return self.stages is None or bool(self.stages)

    def of(self, schedule) -> frozenset:
        """The schedule's stages these are (its model stages from 0 to ``pipeline_length - 1``:
        every stage of a one-pipeline schedule, one model copy's for DualPipe); a stage the
        model lacks is a ConfigError."""
        if self.stages is None:
            return frozenset(range(schedule.stages))
        length = schedule.pipeline_length
        outside = sorted(s for s in self.stages if not 0 <= s < length)
        if outside:
            copies = f" (each of its {schedule.pipelines} model copies)" if schedule.pipelines > 1 else ""
            raise ConfigError(f"recompute names stage {outside[0]}, but the model has stages 0 to {length - 1}{copies}")
        return frozenset(s for s in range(schedule.stages) if schedule.model_stage(s) in self.stages)


def recompute_stages(spec, schedule) -> frozenset:
    """The schedule's stages to recompute for ``spec`` (anything :meth:`Recomputed.parse` takes)."""
    return Recomputed.parse(spec).of(schedule)
