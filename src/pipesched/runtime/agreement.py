"""Ranks agree before they run: on how the runtime was built, and before each step on its batch.

Every rank builds its share of the pipeline from its own arguments, so ranks given different
ones would train a different model than any of them describes (another rank's blocks dropped,
another seed's weights) without a word. At construction :func:`agree_at_construction` gathers a
few short strings from every rank (one small all-gather) and refuses, on every rank, the first
that differs, naming the field and the ranks: the schedule, the block counts, the seed, the
dtype, gradient clipping, the model's signature (every block's parameter and buffer names,
shapes and dtypes, built on the meta device) and the sample input. The same pass checks that
every stage ends in a tensor (what the runtime sends on, or gives to the loss).

A misuse that only one rank can see (its batch shaped unlike ``sample_input``, a loss that is
not a scalar) would otherwise fail on that rank alone while the others wait for it: at the
start of every step :meth:`StepChecks.before_step` looks at what this rank was given and all
ranks agree, in one all-reduce of a flag, that every rank's is usable; if not, every rank
raises the same one-line error naming the step, the rank and why, before any message is sent.
Both use the mesh's world group, whose waits ``timeout_s`` bounds.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

from ..errors import ConfigError
from ..schedule import Schedule
from .p2p import PeerFailure
from .partition import meta_block, stage_block_ranges


class RanksDisagree(ConfigError):
    """Ranks built the runtime from different arguments (names the field and the ranks)."""


class StepMisuse(ConfigError):
    """A rank was given a batch or a loss the step cannot run (every rank raises it)."""


def _schedule_term(schedule: Schedule) -> str:
    digest = hashlib.sha256(repr((schedule.placement, schedule.orders, schedule.pipelines)).encode()).hexdigest()
    return (f"{schedule.name} ({schedule.ranks} ranks, {schedule.microbatches} microbatches, "
            f"{schedule.stages} stages, actions #{digest[:10]})")


def _model_term(build_block: Callable[[int], torch.nn.Module], ranges: Sequence[range], sample: torch.Tensor) -> str:
    """Every block's state names, shapes and dtypes (hashed), each stage's output checked to be
    a tensor, on the meta device (nothing allocated)."""
    sha = hashlib.sha256()
    x: Any = torch.zeros(sample.shape, dtype=sample.dtype, device="meta")
    tensors = 0
    with torch.no_grad():
        for s, blocks in enumerate(ranges):
            for i in blocks:
                block = meta_block(build_block, i)
                for name, t in block.state_dict().items():
                    sha.update(f"{i}.{name}:{tuple(t.shape)}:{t.dtype};".encode())
                    tensors += 1
                try:
                    x = block(x)
                except Exception as err:  # noqa: BLE001  (said in one line: which block, given what)
                    if isinstance(x, torch.Tensor):
                        raise
                    raise ConfigError(f"block {i - 1} returns a {type(x).__name__}, which block {i} cannot take "
                                      f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
            if not isinstance(x, torch.Tensor):
                raise ConfigError(
                    f"block {blocks[-1]}, the last of stage {s}, returns a {type(x).__name__}, not a tensor: "
                    "a stage's output is sent to the next stage (or given to the loss) as one tensor; return "
                    "a tensor, or give the blocks that pass a tuple on the same stage (block_counts)"
                )
    blocks = sum(len(r) for r in ranges)
    return f"{blocks} blocks, {tensors} state tensors, #{sha.hexdigest()[:10]}"


def agree_at_construction(group: Any, build_block: Callable[[int], torch.nn.Module], num_blocks: int,
                          schedule: Schedule, stages: int, block_counts: Optional[Sequence[int]], seed: int,
                          dtype: torch.dtype, clip_grad_norm: Optional[float], sample_input: torch.Tensor) -> None:
    """Refuse (RanksDisagree, on every rank) arguments that differ across the ranks of ``group``;
    ``stages`` is the number of stages of one model copy. Collective: one all-gather. What one
    rank refuses by itself (invalid block counts, a stage ending in a tuple) is gathered too, and
    raised on every rank once they agree on it."""
    refused: Optional[ConfigError] = None
    counts = model = None
    try:
        ranges = stage_block_ranges(num_blocks, stages, block_counts)
        counts = str(tuple(len(r) for r in ranges))
        model = _model_term(build_block, ranges, sample_input)
    except ConfigError as err:
        refused = err
    every: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, {
        "the schedule": _schedule_term(schedule),
        "block_counts": counts or f"{tuple(block_counts or ())} (refused: {refused})",
        "seed": str(seed),
        "dtype": str(dtype).replace("torch.", ""),
        "clip_grad_norm": str(clip_grad_norm),
        "sample_input": f"{list(sample_input.shape)} {str(sample_input.dtype).replace('torch.', '')}",
        "the model": model or f"refused ({refused})",
    }, group=group)
    _refuse_differences(every)
    if refused is not None:
        raise refused


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

    def __init__(self, sample_input: torch.Tensor, loss_fn: Callable, microbatches: int, dp: int,
                 needs_inputs: bool, needs_targets: bool, model_output: tuple[torch.Size, torch.dtype],
                 group: Any) -> None:
        self.sample = (tuple(sample_input.shape), sample_input.dtype)
        self.loss_fn = loss_fn
        self.m, self.dp = microbatches, dp
        self.needs_inputs, self.needs_targets = needs_inputs, needs_targets
        self.model_output = model_output
        self.group = group
        self._loss_checked: set = set()  # target (shape, dtype) whose loss was found a scalar

    def problem(self, inputs: Optional[torch.Tensor], targets: Optional[torch.Tensor]) -> Optional[str]:
        """Why this rank cannot run the step with these tensors, or None."""
        for what, batch, needed in (("inputs", inputs, self.needs_inputs), ("targets", targets, self.needs_targets)):
            if not needed:
                continue
            if batch is None:
                return f"it holds a first or last stage and needs the {what}, but got None"
            if batch.dim() == 0 or batch.shape[0] % (self.m * self.dp):
                return (f"the {what}' batch of {batch.shape[0] if batch.dim() else 'a scalar'} does not split into "
                        f"{self.dp} replica(s) x {self.m} equal microbatches")
        if self.needs_inputs:
            shape = (inputs.shape[0] // (self.m * self.dp), *inputs.shape[1:])
            if (shape, inputs.dtype) != self.sample:
                return (f"a microbatch of its inputs is {list(shape)} {inputs.dtype}, but sample_input was "
                        f"{list(self.sample[0])} {self.sample[1]} (receive buffers are sized from it)")
        if self.needs_targets:
            return self._loss_problem(targets)
        return None

    def _loss_problem(self, targets: torch.Tensor) -> Optional[str]:
        """A loss that is not one number cannot start the backward: tried once per target shape
        on the meta device (a loss function meta tensors cannot run is left to the step)."""
        key = (tuple(targets.shape), targets.dtype)
        if key in self._loss_checked:
            return None
        shape, dtype = self.model_output
        target = torch.empty((targets.shape[0] // (self.m * self.dp), *targets.shape[1:]), dtype=targets.dtype,
                             device="meta")
        try:
            loss = self.loss_fn(torch.empty(shape, dtype=dtype, device="meta"), target)
        except Exception:  # noqa: BLE001  (not runnable on meta: nothing can be said before the step)
            self._loss_checked.add(key)
            return None
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = f"a tensor of shape {list(loss.shape)}" if isinstance(loss, torch.Tensor) else f"a {type(loss).__name__}"
            return f"the loss function returned {got}, but the backward needs one number (reduce it, e.g. .mean())"
        self._loss_checked.add(key)
        return None

    def before_step(self, inputs: Optional[torch.Tensor], targets: Optional[torch.Tensor], step: int) -> None:
        """Agree with every rank that all were given a usable step (collective: one all-reduce);
        StepMisuse on every rank, naming the first rank's problem, if not."""
        problem = self.problem(inputs, targets)
        flag = torch.tensor([problem is not None], dtype=torch.int32)
        if dist.get_backend(self.group) != "gloo":
            flag = flag.to(torch.device("cuda", torch.cuda.current_device()))
        try:
            dist.all_reduce(flag, group=self.group)
        except RuntimeError as err:  # gloo's "Timed out waiting 3000ms for recv", a peer gone
            raise PeerFailure(f"rank {dist.get_rank()} gave up waiting for every rank to start step {step}: "
                              f"{str(err).splitlines()[0].split('] ')[-1] if str(err) else type(err).__name__}") from None
        if not flag.item():
            return
        every: list = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(every, (dist.get_rank(), problem), group=self.group)
        rank, said = next((r, p) for r, p in every if p is not None)
        raise StepMisuse(f"step {step}: rank {rank}: {said}")
