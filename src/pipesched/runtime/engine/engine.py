"""The engine: runs one rank's program of one step, one handler per instruction.

The program (:mod:`.program`, lowered once from the schedule) is the rank's instructions in
torch's grammar (:class:`~pipesched.ops.Op`). The engine is a table from op to handler and a loop
over the program; each handler is short and does one thing:

- ``F``, ``I``, ``B``, ``W``: take the input (the batch's, a message ``RECV`` posted, or what a stage
  of this rank handed over in memory), have the stage's :class:`~.stage_runner.StageRunner`
  compute, and hand the output on (to the ``SEND`` after it, or in memory);
- ``SEND_F``/``SEND_B`` send what the compute before produced; ``RECV_F``/``RECV_B`` post a receive;
- ``REDUCE_GRAD`` starts the reductions a stage's final gradients complete (:mod:`.reduction`);
- ``UNSHARD``/``RESHARD`` gather and free a sharded stage's parameters (no-ops on whole stages:
  each stage's :class:`~.stage_runner.StagePart` says).

An overlapped pair's halves (``half`` 1 and 2) run one after the other, or, where the engine is
given ``interleave_timeout_s`` (the executor does under expert parallelism), interleaved at their
all-to-alls (:mod:`.pair_turns`; the CUDA side stream of :mod:`.overlap_streams` is then unused).

The engine is built from its parts (program, runners, transport, reductions, streams, meter) and
holds no runtime: :mod:`.local_transport` runs several ranks' engines in one process. The clock:
a compute's span starts once its input has arrived and ends after the ``SEND``\\ s and
``REDUCE_GRAD``\\ s that follow it, as an action's did before communication was explicit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from ...ops import SENDS, Op
from ..metering.exchange_waits import EXCHANGE_WAITS
from ..metering.memory_meter import ActivationMeter
from ..program.instructions import Instruction, RankProgram
from ..stages.precision import Precision
from .overlap_streams import OverlapStreams
from .pair_turns import run_interleaved
from .stage_runner import StageRunner

ActionObserver = Callable[[tuple, int, int, int], None]  # (action, bytes before, after, highest)
SPAN_KEEPERS = SENDS | {Op.REDUCE_GRAD}  # what runs inside the span of the compute before it


@dataclass
class StepBatch:
    """One step's microbatches as this rank uses them: inputs (where a first stage is), targets
    (where a loss stage is), batch contexts (None: the step has none)."""

    inputs: Optional[tuple] = None
    targets: Optional[tuple] = None
    contexts: Optional[list] = None

    def context(self, k: int) -> Optional[dict]:
        return self.contexts[k] if self.contexts is not None else None


@dataclass
class _Step:
    """What one run of the program keeps between its instructions."""

    batch: StepBatch
    clock: object
    observer: Optional[ActionObserver]
    losses_known: Optional[Callable[[list], None]]
    metering: bool
    losses: list
    losses_due: int
    outgoing: dict = field(default_factory=dict)  # message -> entries a compute produced for its SEND
    handed: dict = field(default_factory=dict)  # (stage, "act" | "grad", microbatch) -> entries in memory
    marks: list = field(default_factory=list)
    opened: Optional[tuple] = None  # (action, start mark, bytes before) of the span still open


class NoReductions:
    """The reductions of a rank that shares no weight with another (one replica, nothing tied)."""

    def reduce_grad(self, stage: int) -> None:
        pass


class Engine:
    """One rank's program loop, built once from its parts."""

    def __init__(self, program: RankProgram, runners: dict[int, StageRunner], transport, *,
                 reductions=None, precision: Precision, meter: ActivationMeter,
                 streams: Optional[OverlapStreams] = None, losses_per_step: Optional[int] = None,
                 interleave_timeout_s: Optional[float] = None) -> None:
        self.program, self.runners, self.transport = program, runners, transport
        self.interleave_timeout_s = interleave_timeout_s  # None: a pair's halves one after the other
        self.reductions = reductions if reductions is not None else NoReductions()
        self.precision, self.meter, self.streams = precision, meter, streams
        self.losses_per_step = losses_per_step if losses_per_step is not None else sum(
            1 for ins in program.instructions if ins.op is Op.F and runners[ins.stage].computes_loss)
        self.handlers: dict[Op, Callable[[Instruction, _Step], None]] = {
            Op.F: self._forward, Op.I: self._input_backward, Op.B: self._full_backward, Op.W: self._weight,
            Op.SEND_F: self._send, Op.SEND_B: self._send, Op.RECV_F: self._post, Op.RECV_B: self._post,
            Op.REDUCE_GRAD: self._reduce_grad, Op.UNSHARD: self._unshard, Op.RESHARD: self._reshard,
        }

    def run(self, batch: StepBatch, microbatches: int, clock, observer: Optional[ActionObserver] = None,
            losses_known: Optional[Callable[[list], None]] = None, metering: bool = True) -> tuple[list, list]:
        """Run this rank's program; returns the microbatches' losses (on a loss stage) and, per
        compute action, (action, start mark, end mark, highest bytes held during it, bytes after).
        ``losses_known`` (if given) is called with the losses as soon as this rank's last one is
        computed (the loss agreement starts then, while the backwards go on)."""
        step = _Step(batch, clock, observer, losses_known, metering, [None] * microbatches, self.losses_per_step)
        self.transport.start_step()
        EXCHANGE_WAITS.reset()
        handlers, program = self.handlers, self.program.instructions
        # the step that learns the stage sizes (observer) times each half apart: it runs them in turn
        interleaving = self.interleave_timeout_s is not None and observer is None
        for i, ins in enumerate(program):
            if ins.half == 2 and interleaving:
                continue  # run with its forward half
            if step.opened is not None and ins.op not in SPAN_KEEPERS:
                self._close(step)
            if ins.half == 1 and interleaving:
                self._interleaved_pair(ins, program[i + 1], step)
            else:
                handlers[ins.op](ins, step)
        if step.opened is not None:
            self._close(step)
        self.transport.finish_step()
        return step.losses, step.marks

    # -- compute -----------------------------------------------------------------------------

    def _forward(self, ins: Instruction, step: _Step) -> None:
        runner, k = self.runners[ins.stage], ins.microbatch
        given = step.batch.inputs[k] if runner.takes_inputs else self._input(ins, step, "act", ins.stage - 1)
        self._start(ins, step)
        target = step.batch.targets[k] if runner.computes_loss else None
        loss, outputs = runner.forward(k, given, target, step.batch.context(k), step.metering)
        if loss is not None:
            self._loss(k, loss, step)
        else:
            self._output(ins, step, "act", outputs)
        self._finish(ins, step)

    def _input_backward(self, ins: Instruction, step: _Step) -> None:
        self._backward(ins, step, split=True)

    def _full_backward(self, ins: Instruction, step: _Step) -> None:
        self._backward(ins, step, split=False)

    def _backward(self, ins: Instruction, step: _Step, split: bool) -> None:
        runner = self.runners[ins.stage]
        grads = None if runner.computes_loss else self._input(ins, step, "grad", ins.stage + 1)
        self._start(ins, step)
        input_grads = runner.backward(ins.microbatch, grads, split)
        if input_grads is not None:
            self._output(ins, step, "grad", input_grads)
        self._finish(ins, step)

    def _weight(self, ins: Instruction, step: _Step) -> None:
        self._start(ins, step)
        self.runners[ins.stage].weight(ins.microbatch)
        self._finish(ins, step)

    def _interleaved_pair(self, first: Instruction, second: Instruction, step: _Step) -> None:
        """An overlapped pair, its halves interleaved at their exchanges (:mod:`.pair_turns`): both
        inputs first, then the halves. Their spans tile the pair's time, split where the first half
        to finish ended (they share it); the pair's sends close the second span."""
        forward, backward = self.runners[first.stage], self.runners[second.stage]
        k, j = first.microbatch, second.microbatch
        given = step.batch.inputs[k] if forward.takes_inputs else self._input(first, step, "act", first.stage - 1)
        grads = None if backward.computes_loss else self._input(second, step, "grad", second.stage + 1)
        before = self.meter.current
        self.meter.high = before
        start, ends = step.clock.mark(), []
        target = step.batch.targets[k] if forward.computes_loss else None
        (loss, outputs), input_grads = run_interleaved(
            lambda: forward.forward(k, given, target, step.batch.context(k), step.metering),
            lambda: backward.backward(j, grads, second.op is Op.I), self.interleave_timeout_s,
            lambda half: ends.append(step.clock.mark()))
        if loss is not None:
            self._loss(k, loss, step)
        else:
            self._output(first, step, "act", outputs)
        if input_grads is not None:
            self._output(second, step, "grad", input_grads)
        step.marks.append((first.action, start, ends[0], self.meter.high, self.meter.current))
        step.opened = (second.action, ends[0], before)

    # -- communication, reductions, gathers --------------------------------------------------

    def _send(self, ins: Instruction, step: _Step) -> None:
        self.transport.send(ins.message, step.outgoing.pop(ins.message))

    def _post(self, ins: Instruction, step: _Step) -> None:
        self.transport.post(ins.message)

    def _reduce_grad(self, ins: Instruction, step: _Step) -> None:
        self.runners[ins.stage].part.reduce_grad()  # a sharded stage's reduce-scatter (whole: its tied sums)
        self.reductions.reduce_grad(ins.stage)

    def _unshard(self, ins: Instruction, step: _Step) -> None:
        self.runners[ins.stage].part.unshard()  # starts the all-gathers; the stage's compute waits for them

    def _reshard(self, ins: Instruction, step: _Step) -> None:
        self.runners[ins.stage].part.reshard()

    # -- what every compute does around its runner's call ------------------------------------

    def _input(self, ins: Instruction, step: _Step, what: str, producer: int) -> list:
        """The entries a compute consumes: its message (waited for here), or what the stage of
        this rank that produced them handed over."""
        if ins.receives is not None:
            return self.transport.receive(ins.receives, ins.action)
        return step.handed.pop((producer, what, ins.microbatch))

    def _output(self, ins: Instruction, step: _Step, what: str, entries: list) -> None:
        """Hand a compute's output on: to the SEND after it (on the wire dtype), or in memory."""
        if ins.sends is not None:
            step.outgoing[ins.sends] = [self.precision.to_wire(t) for t in entries]
        else:
            step.handed[(ins.stage, what, ins.microbatch)] = entries

    def _loss(self, k: int, loss, step: _Step) -> None:
        step.losses[k] = loss
        step.losses_due -= 1
        if step.losses_due == 0 and step.losses_known is not None:
            step.losses_known(step.losses)

    def _start(self, ins: Instruction, step: _Step) -> None:
        """The compute starts (after its input arrived: waiting is idle time, not the action's)."""
        before = self.meter.current
        self.meter.high = before
        if self.streams is not None and self.streams.active:
            self.streams.enter(ins.half)  # CUDA: an overlapped pair's forward half on its own stream
        step.opened = (ins.action, step.clock.mark(), before)

    def _finish(self, ins: Instruction, step: _Step) -> None:
        if self.streams is not None and self.streams.active:
            self.streams.leave(ins.half)  # before the pair's sends: they see both halves done

    def _close(self, step: _Step) -> None:
        """End the open compute's span: its sends and reductions are part of it."""
        action, start, before = step.opened
        step.opened = None
        self.transport.release_sent()
        end = step.clock.mark_end()
        meter = self.meter
        if step.observer is not None:
            step.observer(action, before, meter.current, meter.high)
        step.marks.append((action, start, end, meter.high, meter.current))
