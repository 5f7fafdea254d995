"""Measure a model's pipeline costs for the advisor: a few real steps, then medians.

The profiling run uses ZB-H1 (one chunk per rank, split backward), so the forward ``F``, the
input-gradient backward ``I`` and the weight-gradient backward ``W`` of every stage are timed
separately on real ranks. The delay per cross-rank message is calibrated on the same run: the
one with which the simulator, fed each step's measured action durations, ends the steps when
they ended (at least the one-way latency a ping-pong measures). On CPUs over gloo it is several
times that latency, and without it the advisor would favour schedules that exchange many more
messages (interleaved ones with many chunks) than they can afford. Activation memory
per stage is counted in this process: the bytes autograd saves during one microbatch's forward
(parameters excluded), which is what a stage holds from F until its W.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch

from ..costs import Costs
from ..errors import ConfigError
from ..registry import build_schedule
from .models import MODELS, ModelDef, get_model
from .partition import build_block_seeded, stage_block_ranges
from .timeline import calibrated_comm, median_costs
from .train import TrainConfig, run

if TYPE_CHECKING:
    from ..advise import Advice
    from ..schedule import Schedule

PROFILE_SCHEDULE = "zb-h1"
MS = 1e3


@dataclass(frozen=True)
class Profile:
    """Measured per-stage costs (seconds), p2p latency and activation bytes of one model."""

    model: str
    ranks: int
    microbatches: int
    batch_size: int
    num_blocks: int
    stage_costs: tuple[tuple[float, float, float], ...]  # per stage: median F, I, W
    comm: float  # delay per cross-rank message, calibrated on the profiling run
    activation_bytes: tuple[int, ...]  # per stage, one microbatch
    step_time: float  # median step of the profiling schedule
    model_size: dict = field(default_factory=dict)
    latency: float = 0.0  # one-way p2p latency of a ping-pong outside the steps

    def costs(self) -> Costs:
        """The advisor's costs in milliseconds: per-rank means plus per-stage multipliers."""
        f, i, w = (statistics.fmean(c[k] for c in self.stage_costs) for k in range(3))
        totals = [sum(c) for c in self.stage_costs]
        mean = statistics.fmean(totals)
        return Costs(F=f * MS, B=i * MS, W=w * MS, comm=self.comm * MS,
                     stage_multipliers=tuple(t / mean for t in totals))

    @property
    def max_chunks(self) -> int:
        """Most chunks per rank the model's blocks allow (each stage needs a block)."""
        return max(1, self.num_blocks // self.ranks)

    def summary(self) -> str:
        per_stage = "; ".join(
            f"stage {s}: F {MS * f:.2f} I {MS * i:.2f} W {MS * w:.2f} ms, {a / 1e6:.2f} MB"
            for s, ((f, i, w), a) in enumerate(zip(self.stage_costs, self.activation_bytes))
        )
        return (
            f"measured {self.model} on {self.ranks} ranks, m={self.microbatches}, batch {self.batch_size} "
            f"({PROFILE_SCHEDULE} step {MS * self.step_time:.1f} ms, delay per message {MS * self.comm:.3f} ms "
            f"against a p2p latency of {MS * self.latency:.3f} ms): {per_stage}"
        )


def profile(
    model: str,
    ranks: int,
    microbatches: int,
    batch_size: int,
    steps: int = 4,
    seed: int = 0,
    model_size: Optional[dict] = None,
    timeout_s: float = 300.0,
) -> Profile:
    """Run ``steps`` steps of ZB-H1 on ``ranks`` local ranks and measure every stage."""
    if model not in MODELS:
        raise ConfigError(f"--model {model!r} is not known: use one of {', '.join(MODELS)}")
    if steps < 2:
        raise ConfigError(f"profiling needs at least 2 steps (the first is warm-up), got {steps}")
    if batch_size % microbatches:
        raise ConfigError(
            f"batch size {batch_size} does not split into {microbatches} equal microbatches: "
            f"use a multiple of {microbatches}"
        )
    size = dict(model_size or {})
    md = get_model(model, **size)
    if md.num_blocks < ranks:
        raise ConfigError(f"--model {model} has {md.num_blocks} blocks, fewer than {ranks} ranks")
    schedule = build_schedule(PROFILE_SCHEDULE, ranks, microbatches)
    result = run(TrainConfig(model, schedule, steps, batch_size, seed=seed, model_size=size, timeout_s=timeout_s))
    steps_measured = result.timelines[1:]
    measured = median_costs(steps_measured)
    stage_costs = tuple(
        (measured[(s, "F")], measured[(s, "I")], measured[(s, "W")]) for s in range(schedule.stages)
    )
    return Profile(
        model=model, ranks=ranks, microbatches=microbatches, batch_size=batch_size,
        num_blocks=md.num_blocks, stage_costs=stage_costs,
        comm=calibrated_comm(schedule, steps_measured, result.comm_latency), latency=result.comm_latency,
        activation_bytes=tuple(activation_bytes(md, ranks, batch_size // microbatches, seed)),
        step_time=result.median_step_time(), model_size=size,
    )


def activation_bytes(md: ModelDef, stages: int, microbatch_size: int, seed: int = 0) -> list[int]:
    """Bytes autograd keeps for one microbatch's forward, per stage (parameters excluded)."""
    x, _ = md.batch(0, microbatch_size, seed)
    held = []
    for blocks in stage_block_ranges(md.num_blocks, stages):
        modules = [build_block_seeded(md.build_block, i, seed) for i in blocks]
        params = {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in params:
                seen[storage.data_ptr()] = storage.nbytes()
            return t

        inp = x.detach().requires_grad_(x.is_floating_point())
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = inp
            for module in modules:
                out = module(out)
        held.append(sum(seen.values()))
        x = out.detach()
    return held


def advise_from_profile(prof: Profile, memory_limit: Optional[float] = None, **options) -> "Advice":
    """The advisor's ranking for the measured costs (chunks capped by the model's blocks)."""
    from ..advise import advise

    options["max_chunks"] = min(options.get("max_chunks", 4), prof.max_chunks)
    return advise(prof.ranks, memory_limit, microbatches=prof.microbatches, costs=prof.costs(), **options)


def auto_schedule(
    model: str, ranks: int, microbatches: int, batch_size: int,
    memory_limit: Optional[float] = None, seed: int = 0, steps: int = 4,
) -> tuple["Schedule", "Advice", Profile]:
    """Profile, advise, and build the recommended schedule (``pipesched train --schedule auto``)."""
    from ..advise.search import objective_option
    from ..registry import get_family

    prof = profile(model, ranks, microbatches, batch_size, steps=steps, seed=seed)
    advice = advise_from_profile(prof, memory_limit)
    best = advice.recommended
    schedule = build_schedule(
        best.schedule, ranks, best.microbatches, best.chunks, best.costs, best.memory_limit,
        **objective_option(get_family(best.schedule), advice.objective),
    )
    return schedule, advice, prof
