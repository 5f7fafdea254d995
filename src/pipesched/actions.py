"""The action grammar shared with torch.distributed.pipelining: ``2F0``, ``1I3``, ``0W2``, ``3B1``.

An action is one unit of compute of one stage on one microbatch:

- ``F`` forward,
- ``I`` backward for the input gradient (the first half of a split backward),
- ``W`` backward for the weight gradient (the second half),
- ``B`` full backward (``I`` and ``W`` fused).

An :class:`Overlap` runs a forward and a backward of two other stage-microbatches together
(DualPipe's F&B, which hides one's communication under the other's compute); torch writes it
``(0F3;3B1)OVERLAP_F_B``.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Union

from .errors import CSVFormatError
from .ops import Op

OVERLAP_F_B = "OVERLAP_F_B"  # torch's computation type of an overlapped forward and backward
_ACTION_RE = re.compile(r"^\s*(\d+)([FIWB])(\d+)\s*$")
MAX_INDEX_DIGITS = 9  # stage and microbatch numbers below a billion: more is never a real schedule
SHOWN_CHARS = 40  # a cell quoted in a message is cut to about this many characters
_OVERLAP_RE = re.compile(r"^\s*\(([^;()]*);([^;()]*)\)" + OVERLAP_F_B + r"\s*$")


class _ActionFields(NamedTuple):
    stage: int
    kind: Op
    microbatch: int


_new_tuple = tuple.__new__


class Action(_ActionFields):
    """One stage's compute on one microbatch; prints and parses as ``<stage><kind><microbatch>``.

    ``kind`` is always an :class:`~pipesched.ops.Op` (a kind given as its letter is looked up)."""

    __slots__ = ()

    def __new__(cls, stage: int, kind: Op | str, microbatch: int) -> "Action":
        # the builders make hundreds of thousands: an Op passes as it is (Op(kind) costs a
        # microsecond), and the tuple is made directly (the named tuple's own __new__ is slower)
        if kind.__class__ is not Op:
            kind = Op(kind)
        return _new_tuple(cls, (stage, kind, microbatch))

    @classmethod
    def _make(cls, fields) -> "Action":  # ``_replace`` builds through it: keep the kind an Op
        return cls(*fields)

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        """Parse ``"2F0"`` into ``Action(2, Op.F, 0)``; raises CSVFormatError on anything else."""
        match = _ACTION_RE.match(text)
        if match is None:
            raise CSVFormatError(
                f"cannot parse action {shown(text)}: expected <stage><kind><microbatch> with kind "
                "F, I, W or B, such as 2F0 or 1I3"
            )
        stage, kind, microbatch = match.groups()
        for what, digits in (("stage", stage), ("microbatch", microbatch)):
            if len(digits.lstrip("0")) > MAX_INDEX_DIGITS:
                raise CSVFormatError(
                    f"action {shown(text)}: the {what} number has {len(digits.lstrip('0'))} digits; "
                    f"stages and microbatches are numbered below 10**{MAX_INDEX_DIGITS}"
                )
        return cls(int(stage), Op(kind), int(microbatch))


class Overlap(NamedTuple):
    """A forward and a backward (``B`` or ``I``) started together on one rank; the pair ends when
    both have (the simulator's ``overlap`` factor says how much they slow each other down).

    Prints and parses as torch's ``(<forward>;<backward>)OVERLAP_F_B``, e.g. ``(0F3;3B1)OVERLAP_F_B``.
    """

    forward: Action
    backward: Action

    def __str__(self) -> str:
        return f"({self.forward};{self.backward}){OVERLAP_F_B}"

    @property
    def parts(self) -> tuple[Action, Action]:
        """The sub-actions in torch's order: the forward, then the backward."""
        return (self.forward, self.backward)


Slot = Union[Action, Overlap]  # one entry of a rank's program


def shown(text: str) -> str:
    """``text`` quoted for a message, a long one cut in the middle (saying how long it was)."""
    text = text.strip()
    if len(text) <= SHOWN_CHARS:
        return repr(text)
    half = SHOWN_CHARS // 2
    return f"{text[:half]!r}...{text[-half:]!r} ({len(text)} characters)"


def parse_slot(text: str) -> Slot:
    """Parse ``"2F0"`` into an Action or ``"(0F3;3B1)OVERLAP_F_B"`` into an Overlap."""
    match = _OVERLAP_RE.match(text)
    if match is None:
        return Action.parse(text)
    forward, backward = Action.parse(match.group(1)), Action.parse(match.group(2))
    if forward.kind is not Op.F or not backward.kind.is_backward:
        raise CSVFormatError(
            f"cannot parse {shown(text)}: an {OVERLAP_F_B} pair is a forward then a backward "
            "(B or I), such as (0F3;3B1)OVERLAP_F_B"
        )
    return Overlap(forward, backward)


def sub_actions(slot: Slot) -> tuple[Action, ...]:
    """The plain actions a program entry runs (one, or an overlapped pair's two)."""
    return slot.parts if isinstance(slot, Overlap) else (slot,)


def F(stage: int, microbatch: int) -> Action:
    """Forward of ``stage`` on ``microbatch``."""
    return Action(stage, Op.F, microbatch)


def I(stage: int, microbatch: int) -> Action:  # noqa: E743 - the grammar's own letter
    """Input-gradient backward of ``stage`` on ``microbatch``."""
    return Action(stage, Op.I, microbatch)


def W(stage: int, microbatch: int) -> Action:
    """Weight-gradient backward of ``stage`` on ``microbatch``."""
    return Action(stage, Op.W, microbatch)


def B(stage: int, microbatch: int) -> Action:
    """Full backward (I and W fused) of ``stage`` on ``microbatch``."""
    return Action(stage, Op.B, microbatch)
