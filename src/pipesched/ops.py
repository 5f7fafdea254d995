"""``Op``: every instruction of a rank's program, in torch.distributed.pipelining's grammar.

One enum for the planning grammar and the runtime alike: a schedule's action kind is an ``Op``
(``F``, ``I``, ``W``, ``B``), and so is every instruction lowering adds around them (``SEND_F``,
``RECV_F``, ``SEND_B``, ``RECV_B``, ``REDUCE_GRAD``, ``UNSHARD``, ``RESHARD``). The values are
torch's spellings (its ``_ComputationType``), so what prints here parses there and back. Only the
parser (:mod:`pipesched.actions`, :mod:`pipesched.schedule_files`) and the printers turn text
into an ``Op`` or an ``Op`` into text; everything else compares members.

A new instruction is a new member here, a lowering pass that places it
(:mod:`pipesched.runtime.program.program.passes`) and an engine handler that runs it
(:mod:`pipesched.runtime.engine.engine.handlers`): docs/extending.md has the recipe.
"""

from __future__ import annotations

from enum import Enum


class Op(str, Enum):
    """One instruction kind. A ``str`` whose value is torch's spelling (``Op.F == "F"``)."""

    F = "F"  # forward
    I = "I"  # noqa: E741 - backward for the input gradient (the first half of a split backward)
    W = "W"  # backward for the weight gradient (the second half)
    B = "B"  # full backward (I and W fused)
    SEND_F = "SEND_F"  # send a forward's output to the next stage's rank
    RECV_F = "RECV_F"  # post the receive of the previous stage's output
    SEND_B = "SEND_B"  # send an input gradient to the previous stage's rank
    RECV_B = "RECV_B"  # post the receive of the next stage's input gradient
    REDUCE_GRAD = "REDUCE_GRAD"  # a stage's gradients are final: reduce them (replicas, shards, ties)
    UNSHARD = "UNSHARD"  # start gathering a sharded stage's parameters (a no-op on whole stages)
    RESHARD = "RESHARD"  # free a stage's gathered parameters (a no-op on whole stages)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def is_compute(self) -> bool:
        """A stage's compute on one microbatch (``F``, ``I``, ``W``, ``B``), as torch's schedules
        tell compute from communication."""
        return self in COMPUTE

    @property
    def is_backward(self) -> bool:
        """``I`` or ``B``: the pass that makes a stage's input gradient."""
        return self is Op.I or self is Op.B

    @property
    def adds_weight_grads(self) -> bool:
        """``W`` or ``B``: a pass that adds to a stage's weight gradients."""
        return self is Op.W or self is Op.B


COMPUTE = frozenset((Op.F, Op.I, Op.W, Op.B))
SENDS = frozenset((Op.SEND_F, Op.SEND_B))
RECEIVES = frozenset((Op.RECV_F, Op.RECV_B))
