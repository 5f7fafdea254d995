"""Where to gather: each stage's ``UNSHARD`` placed per rank from the costs, within a memory limit.

torch's lowering issues a stage's all-gather when the stage enters a fixed window of the next 3
stages a rank runs, the same for every rank. A rank whose first actions come late (every rank
but the first, in the warm-up) can gather later and hold less, and a gather that takes longer
than the compute before its stage's first use should start earlier. :func:`gather_plan` places
the gathers of one rank on its communication lane (one collective at a time) **as late as
possible while each still ends before its stage's first action**: working back from the last
first use, a gather ends at its stage's first use or where the next gather starts, whichever is
earlier. Holding a stage gathered for less time is what saves memory, so this placement holds
each stage the least that hides its gather; where the lane cannot hide one (the gathers before
the rank's first action), the plan says how long the rank waits. A stage stays gathered until
its last action of the step (torchtitan keeps stages gathered under pipelining).

The result names, per stage, the action index before which its ``UNSHARD`` is issued and the
index after which it may be resharded: :mod:`pipesched.runtime.program.planned_gathers` lowers
it in place of the fixed window, checks the program and holds it to a memory limit (what is
gathered at once is the program check's to count, from the program's UNSHARD/RESHARD).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from .errors import ConfigError
from .execution import TOLERANCE


@dataclass(frozen=True)
class Gather:
    """One stage's all-gather on one rank."""

    stage: int
    issue_before: int  # index of the compute action before which UNSHARD is issued
    release_after: int  # index of the stage's last action (RESHARD may follow it)
    start: float  # when the gather starts on the comm lane
    end: float  # when it has landed
    held: float  # how long the stage stays gathered: from the gather's start to its last action's end
    wait: float  # how long the stage's first action waits for it (0: hidden)


def gather_plan(
    actions: Sequence[tuple[int, str, int]],
    durations: Sequence[float],
    gather_time: Mapping[int, float],
    starts: Optional[Sequence[float]] = None,
) -> dict[int, Gather]:
    """Per stage, where its all-gather goes in one rank's compute order; see the module doc.

    ``actions``: the rank's compute actions ``(stage, kind, microbatch)`` in order;
    ``durations``: each one's time; ``starts``: when each starts (default back to back, as if
    the rank never waited; pass a simulated timeline's to place against its waits);
    ``gather_time``: each stage's all-gather time."""
    if len(durations) != len(actions) or (starts is not None and len(starts) != len(actions)):
        raise ConfigError(f"{len(actions)} actions need as many durations (and starts), got {len(durations)}")
    if starts is None:
        starts, clock = [], 0.0
        for d in durations:
            starts.append(clock)
            clock += d
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, (stage, _kind, _mb) in enumerate(actions):
        first.setdefault(stage, i)
        last[stage] = i
    order = sorted(first, key=lambda s: first[s])
    plan: dict[int, float] = {}  # stage -> the latest start that still hides its gather
    latest = float("inf")  # when the next gather on the lane starts
    for stage in reversed(order):
        use = starts[first[stage]]
        start = min(use, latest) - gather_time.get(stage, 0.0)
        latest = start
        plan[stage] = start
    out, free, queued = {}, 0.0, 0
    for stage in order:  # a gather the step's start cuts short starts at 0 and pushes the next ones on
        start = max(plan[stage], free)
        end = free = start + gather_time.get(stage, 0.0)
        if start > plan[stage] + TOLERANCE:  # pushed by the one before: issued with it, queued behind it
            issue = queued
        else:
            issue = max((i for i in range(first[stage] + 1) if starts[i] <= start + TOLERANCE), default=0)
        queued = issue
        done = starts[last[stage]] + durations[last[stage]]
        out[stage] = Gather(stage, issue, last[stage], start, end, done - start,
                            max(0.0, end - starts[first[stage]]))
    return out

