"""The action grammar shared with torch.distributed.pipelining: ``2F0``, ``1I3``, ``0W2``, ``3B1``.

An action is one unit of compute of one stage on one microbatch:

- ``F`` forward,
- ``I`` backward for the input gradient (the first half of a split backward),
- ``W`` backward for the weight gradient (the second half),
- ``B`` full backward (``I`` and ``W`` fused).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import CSVFormatError

KINDS = ("F", "I", "W", "B")
_ACTION_RE = re.compile(r"^\s*(\d+)([FIWB])(\d+)\s*$")


class Action(NamedTuple):
    """One stage's compute on one microbatch; prints and parses as ``<stage><kind><microbatch>``."""

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        """Parse ``"2F0"`` into ``Action(2, "F", 0)``; raises CSVFormatError on anything else."""
        match = _ACTION_RE.match(text)
        if match is None:
            raise CSVFormatError(
                f"cannot parse action {text!r}: expected <stage><kind><microbatch> with kind "
                "F, I, W or B, such as 2F0 or 1I3"
            )
        return cls(int(match.group(1)), match.group(2), int(match.group(3)))


def F(stage: int, microbatch: int) -> Action:
    """Forward of ``stage`` on ``microbatch``."""
    return Action(stage, "F", microbatch)


def I(stage: int, microbatch: int) -> Action:  # noqa: E743 - the grammar's own letter
    """Input-gradient backward of ``stage`` on ``microbatch``."""
    return Action(stage, "I", microbatch)


def W(stage: int, microbatch: int) -> Action:
    """Weight-gradient backward of ``stage`` on ``microbatch``."""
    return Action(stage, "W", microbatch)


def B(stage: int, microbatch: int) -> Action:
    """Full backward (I and W fused) of ``stage`` on ``microbatch``."""
    return Action(stage, "B", microbatch)
