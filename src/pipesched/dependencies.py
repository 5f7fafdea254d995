"""The dependency rule: what each pass waits for, written once and read by every layer.

``F(s,k)`` needs ``F(s-1,k)``; ``I``/``B(s,k)`` needs the backward of ``(s+1,k)``, or ``F(s,k)``
on the last stage; ``W(s,k)`` needs ``I(s,k)``; with several pipelines (DualPipe's two model
copies) each run of ``stages // pipelines`` stages starts and ends its own pipeline. That is
:func:`upstream`; :func:`dependency` asks it for one action, :class:`Dependencies` tabulates it for
a layout (the lowering in :mod:`pipesched.execution` and the schedule builders index the tables),
and :func:`consumer_stage` is its inverse, read from the same tables.
"""

from __future__ import annotations

from enum import Enum
from functools import lru_cache
from typing import Optional

from .actions import Action
from .ops import COMPUTE, Op


class Output(str, Enum):
    """What a pass hands on, named as the passes that wait for it name it: a backward waits for
    the next stage's input gradient, whichever of ``I`` or ``B`` that stage runs (``G``). The
    values are the letters :func:`dependency` has always returned (``Output.INPUT_GRAD == "G"``)."""

    ACTIVATION = "F"  # a forward's output
    INPUT_GRAD = "G"  # an input gradient: an I's, or a B's on a stage whose backward is not split
    WEIGHT_GRAD = "W"  # a W's (nothing waits for it; named so that every pass has an output)

    def __str__(self) -> str:
        return self.value

    @property
    def makers(self) -> tuple[Op, ...]:
        """The kinds whose pass makes this output, in the order lowering looks for them."""
        return _MAKERS[self]

    @property
    def label(self) -> str:
        """How a message names the pass it waits for (``I/B`` for an input gradient)."""
        return "/".join(self.makers)


_MAKERS = {Output.ACTIVATION: (Op.F,), Output.INPUT_GRAD: (Op.I, Op.B), Output.WEIGHT_GRAD: (Op.W,)}
OUTPUT = {kind: output for output, kinds in _MAKERS.items() for kind in kinds}  # Op -> its Output


def upstream(stage: int, kind: Op, length: int) -> Optional[tuple[int, Output]]:
    """The dependency rule, the one place it is written: the stage and output a ``kind`` pass of
    ``stage`` waits for (on the same microbatch) in pipelines of ``length`` stages; None for a
    pipeline's first forward. :func:`dependency`, :class:`Dependencies` (what lowering and the
    schedule builders index) and :func:`consumer_stage` are all read from it."""
    if kind is Op.F:
        return (stage - 1, Output.ACTIVATION) if stage % length else None
    if kind is Op.W:
        return (stage, Output.INPUT_GRAD)
    return (stage + 1, Output.INPUT_GRAD) if (stage + 1) % length else (stage, Output.ACTIVATION)


def dependency(action: Action | tuple[int, Op, int], stages: int,
               pipelines: int = 1) -> Optional[tuple[int, Output, int]]:
    """The (stage, output, microbatch) an action waits for, or None (a pipeline's first F).

    With several pipelines (DualPipe's two model copies) each run of ``stages // pipelines``
    stages starts and ends its own pipeline.
    """
    s, kind, k = action
    found = upstream(s, kind, stages // pipelines)
    return None if found is None else (found[0], found[1], k)


def produced(action: Action) -> tuple[int, Output, int]:
    """The (stage, output, microbatch) ``action`` makes: what :func:`dependency` returns for
    the passes that wait for it."""
    s, kind, k = action
    return (s, OUTPUT[kind], k)


class Dependencies:
    """The rule tabulated for one layout of ``stages`` stages in ``pipelines`` pipelines, so that
    a loop over hundreds of thousands of actions indexes lists instead of asking it each time:
    ``needs[kind][s]`` is :func:`upstream`'s answer for a ``kind`` pass of stage ``s``,
    ``inputs[kind][s]`` the same with the output spelt as the kinds that make it, and
    ``consumers[kind][s]`` the other stage that waits for that pass (or None). Built once per
    layout and shared (:func:`dependencies`), hence tuples."""

    def __init__(self, stages: int, pipelines: int = 1) -> None:
        length = stages // pipelines
        self.needs = {kind: tuple(upstream(s, kind, length) for s in range(stages)) for kind in COMPUTE}
        self.inputs = {kind: tuple(None if need is None else (need[0], need[1].makers) for need in needs)
                       for kind, needs in self.needs.items()}
        consumers: dict[Op, list[Optional[int]]] = {kind: [None] * stages for kind in COMPUTE}
        for needs in self.needs.values():
            for waiting, need in enumerate(needs):
                if need is not None and need[0] != waiting:
                    for maker in need[1].makers:
                        consumers[maker][need[0]] = waiting
        self.consumers = {kind: tuple(per_stage) for kind, per_stage in consumers.items()}


@lru_cache(maxsize=64)
def dependencies(stages: int, pipelines: int = 1) -> Dependencies:
    """The shared :class:`Dependencies` of a layout (built once per layout)."""
    return Dependencies(stages, pipelines)


def consumer_stage(action: Action, stages: int, pipelines: int = 1) -> int | None:
    """The other stage whose pass waits for this action's output: ``F(s)`` feeds ``s+1``'s
    forward, ``I``/``B(s)`` feed ``s-1``'s backward; None for ``W`` and at a pipeline's ends
    (``pipelines`` as in :func:`dependency`)."""
    return dependencies(stages, pipelines).consumers[action[1]][action[0]]
