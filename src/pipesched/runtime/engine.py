"""The engine: runs one rank's actions of one step, whatever the schedule.

Each action is a compute action of one stage and microbatch (``F``, ``I``, ``W``, ``B``); the
communication plan (:mod:`.plan`) says which message it waits for and which it sends. The loop
does only what an action needs: receive its input, make its microbatch's batch context current,
compute, hand its output on (a message, or in memory to a stage on the same rank), start the
gradient reductions it completes, and mark its start and end for the clock. What crosses a
stage edge is a :class:`~.boundary.Boundary`'s flat list of entries: the differentiable ones
require grad and send their gradients back, the others cross as they are.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from . import batch_context
from .boundary import flat
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
    """One rank's action loop, built once by the runtime from its parts."""

    def __init__(self, runtime) -> None:
        self.rt = runtime

    def run(self, in_mbs, tgt_mbs, ctx_mbs, clock, observer: Optional[ActionObserver]) -> tuple[list, list]:
        """Run this rank's actions; returns the microbatches' losses (on a last stage) and, per
        action, (action, start mark, end mark, highest bytes held during it, bytes after it)."""
        rt = self.rt
        plan, transport, stash, meter, streams, reductions = rt.plan, rt.transport, rt.stash, rt.meter, rt.streams, rt.reductions
        takes_inputs, computes_loss, to_wire = rt.copies.takes_inputs, rt.copies.computes_loss, rt.precision.to_wire
        inv_m = 1.0 / rt.schedule.microbatches
        input_bytes, model_stage = rt.input_bytes, rt.copies.model_stage
        arriving = {s: rt.boundaries[model_stage(s) - 1] for s in rt.stages if not takes_inputs(s)}
        leaving = {s: rt.boundaries[model_stage(s)] for s in rt.stages}
        losses: list[Optional[torch.Tensor]] = [None] * rt.schedule.microbatches
        state = StepState()
        marks: list[tuple] = []
        after_action = reductions.after_action if reductions.reduces else None
        set_context = batch_context.set_current if ctx_mbs is not None else None
        transport.start_step()
        for index, (action, send, need) in enumerate(zip(plan.actions, plan.sends, plan.needs)):
            s, kind, k = action
            key = (s, k)
            received = transport.receive(need, action) if need is not None else None
            if set_context is not None:
                set_context(ctx_mbs[k])
            before = meter.current
            meter.high = before
            streams.enter(index)  # CUDA: an overlapped pair's forward half on its own stream
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
                holds = [meter.hold(t) for t in xs]  # no local alias: released with the backward
                state.input_holds[key] = holds
                input_bytes[s] = sum(h.nbytes for h in holds)
                last = computes_loss(s)
                y = rt.forward(s, x, tgt_mbs[k] if last else None)
                if last:
                    losses[k] = y.detach()
                    state.outputs[key] = [y * inv_m]
                else:
                    ys = flat(y)
                    if send is not None:
                        transport.send(send, [to_wire(t.detach()) for t in ys])
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
                    if send is not None:
                        transport.send(send, [to_wire(g) for g in grads])
                    else:
                        state.local_grad[key] = grads
                    del grads
                del xs
            if after_action is not None:
                after_action(index)
            transport.release_sent()
            streams.leave(index)
            end = clock.mark_end()
            if observer is not None:
                observer(action, before, meter.current, meter.high)
            marks.append((action, start, end, meter.high, meter.current))
        if set_context is not None:
            set_context(None)
        transport.finish_step()
        return losses, marks
