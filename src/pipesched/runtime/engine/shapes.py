"""The boundary of every stage edge for a microbatch shape: inferred without running the model for real, cached per shape.

Every rank needs the boundary of every edge it receives across, including edges between stages
it does not hold, so it infers them all from one microbatch: the blocks run on the ``meta``
device (no storage, no compute), on copies when the builder hands back modules that already exist
(on any device, prepared for the split backward by an earlier runtime or not). Where meta cannot
run a block (one that builds a tensor without a device, or reads a value), one real forward of the
microbatch on the run's device does, on seeded copies built for it, with the random generators
restored. :class:`ShapeBook` keeps one inference per microbatch shape (inputs and batch
context), so a step whose sequence length differs from the last one's infers once per new shape,
each rank from what it was given, with no message between ranks.
"""

from __future__ import annotations

import copy
from typing import Callable, Optional, Sequence

import torch

from ..program.instructions import ACT, GRAD
from ..stages import batch_context
from ..stages.boundary import Boundary, Value, flat
from ..stages.partition import BlockBuilder, build_block_seeded, meta_block, run_block


def infer_boundary_shapes(
    build_block: BlockBuilder, ranges: Sequence[range], sample: Value,
    context: Optional[dict] = None, *, seed: int = 0, device: Optional[torch.device] = None,
) -> list[Boundary]:
    """The :class:`~.boundary.Boundary` of every stage's output for one microbatch ``sample``
    (with ``context``, that microbatch's batch context, given to the blocks that take one): on meta, else one real forward
    on ``device`` (see the module's docstring)."""

    def run(blocks_of, place) -> list[Boundary]:
        x = placed(sample, place)
        ctx = None if context is None else {k: placed(v, place) for k, v in context.items()}
        shapes = []
        with torch.no_grad():
            for blocks in ranges:
                for i in blocks:
                    x = run_block(blocks_of(i), x, ctx)
                shapes.append(Boundary.of(x))
        return shapes

    try:
        return run(lambda i: meta_block(build_block, i), torch.device("meta"))
    except Exception:  # noqa: BLE001 -- whatever meta cannot run, a real forward can
        place = device if device is not None else torch.device("cpu")
        with torch.random.fork_rng(devices=[place] if place.type == "cuda" else []):
            return run(lambda i: copy.deepcopy(build_block_seeded(build_block, i, seed)).to(place), place)


def placed(value: Value, device: torch.device) -> Value:
    """``value``'s tensors on ``device`` (on meta: storage-less)."""
    if not isinstance(value, torch.Tensor):
        return Boundary.of(value).unflatten([placed(t, device) for t in flat(value)])
    if device.type == "meta":
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    return value.to(device)


class ShapeBook:
    """The current microbatch shape's boundaries, model stage by model stage, and as they travel
    (every (message kind, schedule stage)), inferring each new shape once."""

    def __init__(self, infer: Callable[[Value, Optional[dict]], list[Boundary]], schedule, copies,
                 wire_dtype, sample: Value, context: Optional[dict]) -> None:
        self.infer, self.schedule, self.copies, self.wire_dtype = infer, schedule, copies, wire_dtype
        self.cache: dict = {}
        self.key = None
        self.update(sample, context)

    def update(self, sample: Optional[Value], context: Optional[dict]) -> bool:
        """Make the shapes of microbatches like ``sample`` (None: the current input shape) and
        ``context`` current; True if they changed."""
        inputs = Boundary.of(sample) if sample is not None else self.key[0]
        key = (inputs, batch_context.shapes(context))
        if key == self.key:
            return False
        if key not in self.cache:
            if sample is None:  # a rank given no inputs: their shape as last seen
                sample = inputs.unflatten([torch.empty(e.shape, dtype=e.dtype, device="meta") for e in inputs.entries])
            self.cache[key] = self.infer(sample, context)
        self.key, self.boundaries = key, self.cache[key]
        self.wire = self._wire()
        return True

    def _wire(self) -> dict:
        """Every (message kind, stage)'s boundary as it travels (the wire dtype)."""
        model_stage, wire, stages = self.copies.model_stage, self.wire_dtype, range(self.schedule.stages)
        shapes = {(ACT, s): self.boundaries[model_stage(s)].on_wire(wire) for s in stages}
        shapes.update({(GRAD, s): self.boundaries[model_stage(s) - 1].gradients().on_wire(wire)
                       for s in stages if not self.copies.takes_inputs(s)})
        return shapes
