"""Ranks agree before they run: on how the runtime was built, and before each step on its batch.

Every rank builds its share of the pipeline from its own arguments, so ranks given different
ones would train a different model than any of them describes (another rank's blocks dropped,
another seed's weights) without a word. At construction :func:`agree_at_construction` gathers a
few short strings from every rank (one small all-gather) and refuses, on every rank, the first
that differs, naming the field and the ranks: the schedule, the block counts, the seed, the
dtype, gradient clipping, the tied parameters, the model's signature (every block's parameter
and buffer names, shapes and dtypes, read on the meta device) and the sample input.

A misuse that only one rank can see (a batch shaped unlike the other ranks', a loss that is
not a scalar) would otherwise fail on that rank alone while the others wait for it: at the
start of every step :meth:`StepChecks.before_step` looks at what this rank was given and all
ranks agree, in one all-reduce of a flag and a hash of the batch's shapes, that every rank's
is usable and alike (the shapes may change between steps, on every rank at once); if not,
every rank raises the same one-line error naming the step, the rank and why, before any
message is sent.
Both use the mesh's world group, whose waits ``timeout_s`` bounds.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ...errors import ConfigError
from ...schedule import Schedule
from ..stages.boundary import Boundary, Value
from ..stages.staged_model import StagedModel
from .p2p import PeerFailure


class RanksDisagree(ConfigError):
    """Ranks built the runtime from different arguments (names the field and the ranks)."""


class StepMisuse(ConfigError):
    """A rank was given a batch or a loss the step cannot run (every rank raises it)."""


def _schedule_term(schedule: Schedule) -> str:
    digest = hashlib.sha256(repr((schedule.placement, schedule.orders, schedule.pipelines)).encode()).hexdigest()
    return (f"{schedule.name} ({schedule.ranks} ranks, {schedule.microbatches} microbatches, "
            f"{schedule.stages} stages, actions #{digest[:10]})")


def _model_term(build_block: Callable[[int], torch.nn.Module], num_blocks: int) -> str:
    """Every block's state names, shapes and dtypes, hashed: read from the blocks as the builder
    gives them on the meta device (a module built before the runtime is read where it is; no
    block is run or copied)."""
    sha = hashlib.sha256()
    tensors = 0
    for i in range(num_blocks):
        with torch.device("meta"):
            block = build_block(i)
        for name, t in block.state_dict().items():
            sha.update(f"{i}.{name}:{tuple(t.shape)}:{t.dtype};".encode())
            tensors += 1
    return f"{num_blocks} blocks, {tensors} state tensors, #{sha.hexdigest()[:10]}"


def agree_at_construction(group: Any, model: StagedModel, schedule: Schedule, stages: int, options: Any) -> None:
    """Refuse (RanksDisagree, on every rank) arguments that differ across the ranks of ``group``;
    ``stages`` is the number of stages of one model copy, ``options`` the RuntimeOptions.
    Collective: one all-gather. What one rank refuses by itself (invalid block counts) is
    gathered too, and raised on every rank once they agree on it."""
    refused: Optional[ConfigError] = None
    counts = None
    try:
        counts = str(tuple(len(r) for r in model.stage_ranges(stages)))
    except ConfigError as err:
        refused = err
    every: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, {
        "the schedule": _schedule_term(schedule),
        "block_counts": counts or f"{tuple(model.block_counts or ())} (refused: {refused})",
        "seed": str(options.seed),
        "dtype": str(options.dtype).replace("torch.", ""),
        "clip_grad_norm": str(options.clip_grad_norm),
        "tied parameters": str(model.tied),
        "sample_input": _described(model.sample_input),
        "the model": _model_term(model.build_block, model.num_blocks),
    }, group=group)
    _refuse_differences(every)
    if refused is not None:
        raise refused


def _described(value: Optional[Value], split: int = 1) -> str:
    """Shapes and dtypes of a tensor, or of a tuple or dict of them, the batch dim divided by ``split``."""
    if value is None:
        return "nothing"
    tensors = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (tuple, list)) else [(None, value)]
    parts = []
    for key, t in tensors:
        if not isinstance(t, torch.Tensor):
            parts.append(f"{key}: a {type(t).__name__}")
            continue
        parts.append(_entry_text(key, [t.shape[0] // split, *t.shape[1:]] if t.dim() else [], t.dtype))
    return ", ".join(parts)


def _boundary_text(boundary: Boundary) -> str:
    """A boundary's entries as :func:`_described` writes the microbatch they were inferred from."""
    keys = boundary.keys if boundary.keys is not None else (None,)
    return ", ".join(_entry_text(key, list(e.shape), e.dtype) for key, e in zip(keys, boundary.entries))


def _entry_text(key, shape: list, dtype: torch.dtype) -> str:
    return ("" if key is None else f"{key}: ") + f"{shape} {str(dtype).replace('torch.', '')}"


def _refuse_differences(every: list[dict]) -> None:
    for field in every[0]:
        values = [terms[field] for terms in every]
        if len(set(values)) > 1:
            by_value: dict[str, list[int]] = {}
            for rank, value in enumerate(values):
                by_value.setdefault(value, []).append(rank)
            said = ", ".join(f"{_ranks(ranks)} {'have' if len(ranks) > 1 else 'has'} {value}"
                             for value, ranks in by_value.items())
            raise RanksDisagree(
                f"the ranks disagree on {field}: {said}; every rank must build PipelineRuntime from the same arguments"
            )


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


class StepChecks:
    """What one rank checks of its step's batch before any message moves (see module doc)."""

    def __init__(self, loss_fn: Callable, shapes: Any, mesh: Any, needs_inputs: bool, needs_targets: bool) -> None:
        self.loss_fn, self.shapes, self.mesh = loss_fn, shapes, mesh
        self.m = shapes.schedule.microbatches
        self.needs_inputs, self.needs_targets = needs_inputs, needs_targets
        self._loss_checked: set = set()  # target (shape, dtype) whose loss was found a scalar

    def problem(self, inputs: Optional[Value], targets: Optional[torch.Tensor]) -> Optional[str]:
        """Why this rank cannot run the step with these tensors, or None."""
        parts = self.m * self.mesh.dp
        for what, batch, needed in (("inputs", inputs, self.needs_inputs), ("targets", targets, self.needs_targets)):
            if batch is None:
                if needed:
                    return f"it holds a first or last stage and needs the {what}, but got None"
                continue
            tensors = list(batch.values()) if isinstance(batch, dict) else list(batch) if isinstance(batch, (tuple, list)) else [batch]
            for t in tensors:
                if not isinstance(t, torch.Tensor):
                    return f"its {what} hold a {type(t).__name__}, not tensors"
                if t.dim() == 0 or t.shape[0] % parts:
                    return (f"the {what}' batch of {t.shape[0] if t.dim() else 'a scalar'} does not split into "
                            f"{self.mesh.dp} replica(s) x {self.m} equal microbatches")
        if self.needs_targets:
            return self._loss_problem(targets)
        return None

    def _loss_problem(self, targets: torch.Tensor) -> Optional[str]:
        """A loss that is not one number cannot start the backward: tried once per target shape
        on the meta device (a loss function meta tensors cannot run is left to the step)."""
        key = (tuple(targets.shape), targets.dtype)
        output = self.shapes.boundaries[-1]
        if key in self._loss_checked or output.keys is not None:
            return None
        self._loss_checked.add(key)
        entry = output.entries[0]
        target = torch.empty((targets.shape[0] // (self.m * self.mesh.dp), *targets.shape[1:]), dtype=targets.dtype,
                             device="meta")
        try:
            loss = self.loss_fn(torch.empty(entry.shape, dtype=entry.dtype, device="meta"), target)
        except Exception:  # noqa: BLE001  (not runnable on meta: nothing can be said before the step)
            return None
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = f"a tensor of shape {list(loss.shape)}" if isinstance(loss, torch.Tensor) else f"a {type(loss).__name__}"
            return f"the loss function returned {got}, but the backward needs one number (reduce it, e.g. .mean())"
        return None

    def _shape_term(self, inputs: Optional[Value], context: Optional[dict]) -> str:
        """What decides this step's boundary shapes on this rank: its inputs' microbatch shapes (a
        rank given none: the last it knew) and the context's."""
        parts = self.m * self.mesh.dp
        mine = _described(inputs, parts) if inputs is not None else _boundary_text(self.shapes.key[0])
        return f"inputs {mine}; context {_described(context, parts) if context else 'none'}"

    def before_step(self, inputs: Optional[Value], targets: Optional[torch.Tensor], context: Optional[dict],
                    step: int) -> None:
        """Agree with every rank that all were given a usable step, alike in shape (collective: one
        all-reduce of a flag and a hash of the shapes); StepMisuse on every rank, naming the first
        rank's problem or the ranks whose shapes differ, if not."""
        problem = self.problem(inputs, targets)
        term = self._shape_term(inputs, context)
        digest = int.from_bytes(hashlib.sha256(term.encode()).digest()[:6], "big")  # exact in int64 and float64
        flags = torch.tensor([problem is not None, digest, -digest], dtype=torch.int64)
        group = self.mesh.world_group
        if dist.get_backend(group) != "gloo":
            flags = flags.to(torch.device("cuda", torch.cuda.current_device()))
        try:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
        except RuntimeError as err:  # gloo's "Timed out waiting 3000ms for recv", a peer gone
            raise PeerFailure(f"rank {dist.get_rank()} gave up waiting for every rank to start step {step}: "
                              f"{str(err).splitlines()[0].split('] ')[-1] if str(err) else type(err).__name__}") from None
        bad, high, low = flags.tolist()
        if not bad and high == -low:
            return
        every: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(every, (dist.get_rank(), problem, term), group=group)
        said = next(((r, p) for r, p, _ in every if p is not None), None)
        if said is not None:
            raise StepMisuse(f"step {step}: rank {said[0]}: {said[1]}")
        by_term: dict[str, list[int]] = {}
        for rank, _, shape_term in every:
            by_term.setdefault(shape_term, []).append(rank)
        differ = "; ".join(f"{_ranks(ranks)}: {shape_term}" for shape_term, ranks in by_term.items())
        raise StepMisuse(f"step {step}: the ranks were given batches of different shapes ({differ}): give every "
                         "rank the same batch shapes (and the inputs on every rank when their shape changes)")
