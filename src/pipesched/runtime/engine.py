"""The engine: runs one rank's program of one step, whatever the schedule.

The program (:mod:`.program`, lowered once from the schedule) is the rank's compute actions
(``F``, ``I``, ``W``, ``B`` of one stage and microbatch, an overlapped pair's two halves) with its
communication and reductions explicit: ``RECV_F``/``RECV_B`` post a receive, ``SEND_F``/``SEND_B``
send what the compute before them produced, ``REDUCE_GRAD`` says a stage's gradients are final.
The engine executes that and nothing else. A compute instruction does only what it needs: wait
for its input (if it names a message), make its microbatch's batch context current, compute,
hand its output on (to the SENDs after it, or in memory to a stage on the same rank), and mark its
start and end for the clock: its span starts once its input has arrived and ends after the SENDs
and REDUCE_GRADs that follow it, as an action's did before communication was explicit. What crosses a
stage edge is a :class:`~.boundary.Boundary`'s flat list of entries: the differentiable ones
require grad and send their gradients back, the others cross as they are.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from . import batch_context
from .boundary import flat
from .program import RECEIVES, REDUCE_GRAD, SENDS
from .split_backward import apply_weight_grads

ActionObserver = Callable[[tuple, int, int, int], None]  # (action, bytes before, after, highest)


class StepState:
    """What one step holds between a microbatch's actions, keyed by (stage, microbatch)."""

    __slots__ = ("inputs", "outputs", "local_act", "local_grad", "deferred", "input_holds")

    def __init__(self) -> None:
        self.inputs: dict = {}  # stage input entries (leaves)
        self.outputs: dict = {}  # per differentiable output entry: the tensor to backward from, or None; or [scaled loss]
        self.local_act: dict = {}  # output value handed to stage + 1 on this rank
        self.local_grad: dict = {}  # input gradient entries handed to stage - 1 on this rank
        self.deferred: dict = {}  # stashed Linear backward parts and their meter holds
        self.input_holds: dict = {}  # the meter's holds on the stage input's entries


class Engine:
    """One rank's program loop, built once by the runtime from its parts."""

    def __init__(self, runtime) -> None:
        self.rt = runtime

    def run(self, in_mbs, tgt_mbs, ctx_mbs, clock, observer: Optional[ActionObserver],
            losses_known: Optional[Callable[[list], None]] = None) -> tuple[list, list]:
        """Run this rank's program; returns the microbatches' losses (on a last stage) and, per
        compute action, (action, start mark, end mark, highest bytes held during it, bytes after).
        ``losses_known`` (if given) is called with the losses as soon as this rank's last one is
        computed (the loss agreement starts then, while the backwards go on)."""
        rt = self.rt
        transport, stash, meter, streams, reductions = rt.transport, rt.stash, rt.meter, rt.streams, rt.reductions
        takes_inputs, computes_loss, to_wire = rt.copies.takes_inputs, rt.copies.computes_loss, rt.precision.to_wire
        inv_m = 1.0 / rt.schedule.microbatches
        input_bytes, model_stage, boundaries = rt.input_bytes, rt.copies.model_stage, rt.shapes.boundaries
        arriving = {s: boundaries[model_stage(s) - 1] for s in rt.stages if not takes_inputs(s)}
        leaving = {s: boundaries[model_stage(s)] for s in rt.stages}
        losses: list[Optional[torch.Tensor]] = [None] * rt.schedule.microbatches
        losses_due = rt.losses_per_step
        state = StepState()
        marks: list[tuple] = []
        outgoing: dict = {}  # message -> what a compute produced for a SEND after it (a pair's halves: two)
        set_context = batch_context.set_current if ctx_mbs is not None else None
        overlap = streams.active

        def close(action, start, before) -> None:
            """End the span of the compute before: its sends and reductions are part of it."""
            transport.release_sent()
            end = clock.mark_end()
            if observer is not None:
                observer(action, before, meter.current, meter.high)
            marks.append((action, start, end, meter.high, meter.current))

        opened = None  # (action, start, bytes before) of the compute whose span is still open
        transport.start_step()
        for index, ins in enumerate(rt.program.instructions):
            op = ins.op
            if op in SENDS:
                transport.send(ins.message, outgoing.pop(ins.message))
                continue
            if op == REDUCE_GRAD:
                reductions.reduce_grad(index)
                continue
            if opened is not None:
                close(*opened)
                opened = None
            if op in RECEIVES:
                transport.post(ins.message)
                continue
            action = ins.action
            s, kind, k = action
            key = (s, k)
            need = ins.receives
            received = transport.receive(need, action) if need is not None else None
            if set_context is not None:
                set_context(ctx_mbs[k])
            before = meter.current
            meter.high = before
            if overlap:
                streams.enter(ins.half)  # CUDA: an overlapped pair's forward half on its own stream
            start = clock.mark()  # after the wait: waiting is idle time, not the action's
            if kind == "F":
                if takes_inputs(s):
                    x = in_mbs[k]
                    xs = [x]
                else:
                    if need is not None:
                        xs = received
                        x = arriving[s].unflatten(xs)
                    else:
                        x = state.local_act.pop((s - 1, k))
                        xs = flat(x)
                    for t in xs:
                        if t.is_floating_point():
                            t.requires_grad_(True)
                # no local alias: the holds are released with the backward (a name left here would
                # keep the last forward's stage input counted through the backward that follows it)
                state.input_holds[key] = [meter.hold(t) for t in xs]
                input_bytes[s] = sum(h.nbytes for h in state.input_holds[key])
                last = computes_loss(s)
                y = rt.forward(s, x, tgt_mbs[k] if last else None)
                if last:
                    losses[k] = y.detach()
                    state.outputs[key] = [y * inv_m]
                    losses_due -= 1
                    if losses_due == 0 and losses_known is not None:
                        losses_known(losses)
                else:
                    ys = flat(y)
                    if ins.sends is not None:
                        outgoing[ins.sends] = [to_wire(t.detach()) for t in ys]
                    else:
                        state.local_act[key] = leaving[s].unflatten([t.detach() for t in ys])
                    # the backward needs only the outputs' graphs: their data lives on only where
                    # the next stage or a saved tensor still holds it (Megatron's deallocation)
                    kept = []
                    for t in ys:
                        if t.is_floating_point():
                            if t.requires_grad:
                                t.data = torch.empty((), dtype=t.dtype, device=t.device).expand(t.shape)
                                kept.append(t)
                            else:
                                kept.append(None)
                    state.outputs[key] = kept
                state.inputs[key] = xs
                del x, xs, y
            elif kind == "W":
                entries, _holders = state.deferred.pop(key)
                apply_weight_grads(entries)
                del entries, _holders
            else:
                outs = state.outputs.pop(key)
                if computes_loss(s):
                    pairs_t, pairs_g = outs, None
                else:
                    grads = received if need is not None else state.local_grad.pop((s + 1, k))
                    pairs_t, pairs_g = [], []
                    for t, g in zip(outs, grads):
                        if t is not None:
                            pairs_t.append(t)
                            pairs_g.append(g.to(t.dtype))  # a bf16 boundary gradient of an fp32 output
                if kind == "I":
                    entries: list = []
                    stash.collecting = entries
                    if pairs_t:
                        torch.autograd.backward(pairs_t, pairs_g)
                    stash.collecting = None
                    state.deferred[key] = (entries, stash.holders)
                    stash.holders = []
                elif pairs_t:
                    torch.autograd.backward(pairs_t, pairs_g)
                del outs, pairs_t, pairs_g
                state.input_holds.pop(key)
                xs = state.inputs.pop(key)
                if not takes_inputs(s):
                    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in xs if t.is_floating_point()]
                    if ins.sends is not None:
                        outgoing[ins.sends] = [to_wire(g) for g in grads]
                    else:
                        state.local_grad[key] = grads
                    del grads
                del xs
            if overlap:
                streams.leave(ins.half)  # before the pair's sends: they see both halves done
            opened = (action, start, before)
        if opened is not None:
            close(*opened)
        if set_context is not None:
            set_context(None)
        transport.finish_step()
        return losses, marks
