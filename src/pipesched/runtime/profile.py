"""Measure a model's pipeline costs for the advisor: a few real steps, then medians.

The profiling run uses ZB-H1 (one chunk per rank, split backward), so the forward ``F``, the
input-gradient backward ``I`` and the weight-gradient backward ``W`` of every stage are timed
separately on real ranks. The delay per cross-rank message is calibrated on the same run: the
one with which the simulator, fed each step's measured action durations, ends the steps when
they ended (at least the one-way latency a ping-pong measures). On CPUs over gloo it is several
times that latency, and without it the advisor would favour schedules that exchange many more
messages (interleaved ones with many chunks) than they can afford. The stage overhead (the part of
every F, I and B that does not shrink with a stage's share of the layers: see
:mod:`pipesched.costs`) is measured beside it: the same processes step a two-chunk layout
(:data:`CHUNKED_SCHEDULE`) after each profiled step, and the stage overhead is the one with which
the simulator's ratio of the two layouts' steps is the measured one (medians over steps paired
step by step, so that the machine's drift hits both alike). Without it the advisor prices a rank's
``v`` stages at ``1/v`` of its one, and on CPU ranks over gloo two chunks measure as slow as one
where the model says 5-12% faster (benchmarks/RESULTS.md). Activation memory per
stage is what the runtime measured on the first step (see :mod:`pipesched.runtime.memory_meter`):
the bytes one microbatch's F keeps, what its I leaves for W, and the stage's input (all a
recomputed stage keeps).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Optional


from ..costs import Costs
from ..errors import ConfigError
from ..memory import MemorySizes
from ..registry import build_schedule
from ..simulate import simulate
from .copies import balanced_block_counts
from .models import KNOWN, get_model, is_known
from .timeline import calibrated_comm, makespan, median_costs
from .train import TrainConfig, run

if TYPE_CHECKING:
    from ..advise import Advice
    from ..schedule import Schedule

PROFILE_SCHEDULE = "zb-h1"
CHUNKED_SCHEDULE = "zb-v"  # two chunks per rank, split backward: the profile's second layout
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
    stage_memory: tuple  # per stage, one microbatch: (StageMemory in bytes, input bytes)
    step_time: float  # median step of the profiling schedule
    model_size: dict = field(default_factory=dict)
    latency: float = 0.0  # one-way p2p latency of a ping-pong outside the steps
    stage_blocks: Optional[tuple[int, ...]] = None  # the model's blocks on each stage (None: one each)
    dtype: str = "fp32"  # what the profiled steps computed in (the run's)
    stage_overhead: float = 0.0  # part of each F, I, B not shrinking with a stage's layers (see the module docstring)
    chunked_ratio: Optional[float] = None  # CHUNKED_SCHEDULE's step over PROFILE_SCHEDULE's (None: not run)

    @property
    def activation_bytes(self) -> tuple[float, ...]:
        """What each stage's forward keeps for one microbatch."""
        return tuple(size.keep for size, _ in self.stage_memory)

    def activation(self) -> tuple[float, float, float]:
        """The whole model's bytes for one microbatch: kept by F, stashed for W; one boundary's."""
        boundaries = [inp for _, inp in self.stage_memory[1:]] or [0.0]
        return (sum(self.activation_bytes), sum(size.stash for size, _ in self.stage_memory), max(boundaries))

    def memory_sizes(self) -> MemorySizes:
        """The measured per-stage bytes, with each stage's blocks (what recomputation keeps)."""
        return MemorySizes(tuple(size for size, _ in self.stage_memory), tuple(inp for _, inp in self.stage_memory),
                           blocks=self.stage_blocks)

    def bytes_per_unit(self) -> float:
        """One M_B in bytes: one microbatch's activations on the fullest stage (a rank's share
        under the profiled one-chunk placement; the largest, so a limit in bytes is never
        converted into more M_B than any rank can hold)."""
        return max(self.activation_bytes)

    def costs(self) -> Costs:
        """The advisor's costs in milliseconds: per-rank means plus per-stage multipliers."""
        f, i, w = (statistics.fmean(c[k] for c in self.stage_costs) for k in range(3))
        totals = [sum(c) for c in self.stage_costs]
        mean = statistics.fmean(totals)
        return Costs(F=f * MS, B=i * MS, W=w * MS, comm=self.comm * MS,
                     stage_multipliers=tuple(t / mean for t in totals), stage_overhead=self.stage_overhead * MS)

    @property
    def max_chunks(self) -> int:
        """Most chunks per rank the model's blocks allow (each stage needs a block)."""
        return max(1, self.num_blocks // self.ranks)

    def summary(self) -> str:
        per_stage = "; ".join(
            f"stage {s}: F {MS * f:.2f} I {MS * i:.2f} W {MS * w:.2f} ms, {a / 1e6:.2f} MB"
            for s, ((f, i, w), a) in enumerate(zip(self.stage_costs, self.activation_bytes))
        )
        chunked = (f", stage overhead {MS * self.stage_overhead:.3f} ms ({CHUNKED_SCHEDULE} with 2 chunks measured "
                   f"{self.chunked_ratio:.3f}x its step)" if self.chunked_ratio is not None else "")
        return (
            f"measured {self.model} in {self.dtype} on {self.ranks} ranks, m={self.microbatches}, batch {self.batch_size} "
            f"({PROFILE_SCHEDULE} step {MS * self.step_time:.1f} ms, delay per message {MS * self.comm:.3f} ms "
            f"against a p2p latency of {MS * self.latency:.3f} ms{chunked}): {per_stage}"
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
    dtype: str = "fp32",
) -> Profile:
    """Run ``steps`` steps of ZB-H1 on ``ranks`` local ranks and measure every stage (in
    ``dtype``, the run's: bf16 halves the bytes and changes the times)."""
    if not is_known(model):
        raise ConfigError(f"--model {model!r} is not known: use {KNOWN}")
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
    chunked = build_schedule(CHUNKED_SCHEDULE, ranks, microbatches, 2) if md.num_blocks >= 2 * ranks > 2 else None
    blocks = tuple(balanced_block_counts(md.block_costs, schedule))  # as the run splits them
    result = run(TrainConfig(model, schedule, steps, batch_size, seed=seed, model_size=size, timeout_s=timeout_s,
                             block_counts=blocks, dtype=dtype, alongside=chunked))
    steps_measured = result.timelines[1:]
    measured = median_costs(steps_measured)
    stage_costs = tuple(
        (measured[(s, "F")], measured[(s, "I")], measured[(s, "W")]) for s in range(schedule.stages)
    )
    prof = Profile(
        model=model, ranks=ranks, microbatches=microbatches, batch_size=batch_size,
        num_blocks=md.num_blocks, stage_costs=stage_costs,
        comm=calibrated_comm(schedule, steps_measured, result.comm_latency), latency=result.comm_latency,
        stage_memory=tuple(result.stage_memory[s] for s in range(schedule.stages)),
        step_time=result.median_step_time(), model_size=size, stage_blocks=blocks, dtype=dtype,
    )
    if chunked is None:
        return prof
    ratio = statistics.median(makespan(c) / makespan(p) for p, c in zip(steps_measured, result.alongside_timelines[1:]))
    return replace(prof, chunked_ratio=ratio,
                   stage_overhead=fitted_stage_overhead(schedule, chunked, prof.costs(), ratio) / MS)


def fitted_stage_overhead(one: "Schedule", chunked: "Schedule", costs: Costs, ratio: float) -> float:
    """The stage overhead (in ``costs``' unit) with which ``chunked``'s simulated makespan is
    ``ratio`` times ``one``'s, ``one`` having a stage per rank (so that the stage overhead is inside
    its F, I and B and does not change it); 0 where even none makes ``chunked`` slower than
    ``ratio``, and at most 0.9 of the smaller of F and B (the part of them a stage overhead can be)."""
    base = simulate(one, costs).makespan

    def chunked_ratio(stage_overhead: float) -> float:
        return simulate(chunked, replace(costs, stage_overhead=stage_overhead)).makespan / base

    lo, hi = 0.0, 0.9 * min(costs.F, costs.B)
    if chunked_ratio(lo) >= ratio:
        return 0.0
    if chunked_ratio(hi) <= ratio:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chunked_ratio(mid) < ratio else (lo, mid)
    return (lo + hi) / 2


def advise_from_profile(prof: Profile, memory_limit: Optional[float] = None, limit_bytes: Optional[float] = None,
                        **options) -> "Advice":
    """The advisor's ranking for the measured costs and activation bytes (chunks capped by the
    model's blocks); ``limit_bytes``: activation bytes per rank, recomputation then a choice."""
    from ..advise import advise
    from ..advise.costmodel import ScaledCosts

    options["max_chunks"] = min(options.get("max_chunks", 4), prof.max_chunks)
    model = ScaledCosts(prof.costs(), memory_limit, activation=prof.activation(), limit_bytes=limit_bytes, ranks=prof.ranks,
                        time_unit="ms")
    return advise(prof.ranks, memory_limit, microbatches=prof.microbatches, cost_model=model, **options)


def auto_schedule(
    model: str, ranks: int, microbatches: int, batch_size: int,
    memory_limit: Optional[float] = None, seed: int = 0, steps: int = 4, limit_bytes: Optional[float] = None,
    dtype: str = "fp32", timeout_s: float = 300.0,
) -> tuple["Schedule", "Advice", Profile]:
    """Profile in the run's ``dtype`` and ``timeout_s``, advise, and build the recommended
    schedule (``pipesched train --schedule auto``)."""
    from ..advise.search import objective_option
    from ..registry import get_family

    prof = profile(model, ranks, microbatches, batch_size, steps=steps, seed=seed, dtype=dtype, timeout_s=timeout_s)
    advice = advise_from_profile(prof, memory_limit, limit_bytes)
    best = advice.recommended
    schedule = build_schedule(
        best.schedule, ranks, best.microbatches, best.chunks, best.costs, best.memory_limit,
        **objective_option(get_family(best.schedule), advice.objective),
    )
    return schedule, advice, prof
