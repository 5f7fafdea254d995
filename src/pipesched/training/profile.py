"""Measure a model's pipeline costs for the advisor: a few real steps, then medians.

The profiling run uses ZB-H1 (one chunk per rank, split backward), so the forward ``F``, the
input-gradient backward ``I`` and the weight-gradient backward ``W`` of every stage are timed
separately on real ranks. The delay per cross-rank message is calibrated on the same run: the
one with which the simulator, fed each step's measured action durations, ends the steps when
they ended (at least the one-way latency a ping-pong measures). On CPUs over gloo it is several
times that latency, and without it the advisor would favour schedules that exchange many more
messages (interleaved ones with many chunks) than they can afford.

Two costs are measured from other layouts, by the same processes (:data:`FITTED`): the stage
overhead (the part of every F, I and B that does not shrink with a stage's share of the layers:
see :mod:`pipesched.costs`) from ZB-V with 2 chunks, then a fused backward's cost from 1F1B.
Each is the value with which the simulator's ratio of that layout's step to ZB-H1's is the
measured ratio: after the profiled steps, the layouts and the profiled ZB-H1 take turns for as
many rounds (two steps a turn, the second kept: a step right after another layout's runs up to
twice as slow on CPU ranks), and the ratio is the median over the rounds of the two layouts'
steps in that round, so that the machine's drift hits both alike. Without them the advisor
prices a rank's ``v`` stages at ``1/v`` of its one and a fused backward at ``B + W``: on CPU
ranks over gloo two chunks measured 0.99-1.11x one and 1F1B 0.97-1.02x ZB-H1, where the model
said 0.97x and 1.06-1.13x (benchmarks/RESULTS.md). Activation memory per
stage is what the runtime measured on the first step (see :mod:`pipesched.runtime.metering.memory_meter`):
the bytes one microbatch's F keeps, what its I leaves for W, and the stage's input (all a
recomputed stage keeps).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Optional

from ..bounds import DEFAULT_TIMEOUT_S
from ..costs import Costs
from ..errors import ConfigError
from ..memory import MemorySizes
from ..ops import Op
from ..registry import build_schedule
from ..simulate import simulate
from ..runtime.metering.timeline import calibrated_comm, makespan, median_costs
from ..runtime.options import RuntimeOptions
from ..runtime.stages.copies import balanced_block_counts
from ..runtime.stages.precision import parse_dtype
from .models import KNOWN, get_model, is_known
from .train import TrainConfig, run

if TYPE_CHECKING:
    from ..advise import Advice
    from ..schedule import Schedule

PROFILE_SCHEDULE = "zb-h1"
# the layouts run after the profiled steps, and the Costs field each one's step ratio fits
FITTED = (("zb-v", 2, "stage_overhead"), ("1f1b", 1, "full_backward"))
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
    full_backward: Optional[float] = None  # a fused backward's cost for a rank's share (None: I + W)
    ratios: dict = field(default_factory=dict)  # FITTED's schedule name -> its median step over ZB-H1's

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
                     stage_multipliers=tuple(t / mean for t in totals), stage_overhead=self.stage_overhead * MS,
                     full_backward=None if self.full_backward is None else self.full_backward * MS)

    @property
    def max_chunks(self) -> int:
        """Most chunks per rank the model's blocks allow (each stage needs a block)."""
        return max(1, self.num_blocks // self.ranks)

    def summary(self) -> str:
        per_stage = "; ".join(
            f"stage {s}: F {MS * f:.2f} I {MS * i:.2f} W {MS * w:.2f} ms, {a / 1e6:.2f} MB"
            for s, ((f, i, w), a) in enumerate(zip(self.stage_costs, self.activation_bytes))
        )
        fitted = ""
        if "zb-v" in self.ratios:
            fitted += f", stage overhead {MS * self.stage_overhead:.3f} ms (zb-v with 2 chunks: {self.ratios['zb-v']:.3f}x its step)"
        if "1f1b" in self.ratios:
            fitted += f", full backward {MS * self.full_backward:.2f} ms (1f1b: {self.ratios['1f1b']:.3f}x)"
        return (
            f"measured {self.model} in {self.dtype} on {self.ranks} ranks, m={self.microbatches}, batch {self.batch_size} "
            f"({PROFILE_SCHEDULE} step {MS * self.step_time:.1f} ms, delay per message {MS * self.comm:.3f} ms "
            f"against a p2p latency of {MS * self.latency:.3f} ms{fitted}): {per_stage}"
        )


def profile(
    model: str,
    ranks: int,
    microbatches: int,
    batch_size: int,
    steps: int = 4,
    seed: int = 0,
    model_size: Optional[dict] = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    dtype: str = "fp32",
) -> Profile:
    """Run ``steps`` steps of ZB-H1 on ``ranks`` local ranks and measure every stage (in
    ``dtype``, the run's: bf16 halves the bytes and changes the times), then as many rounds of
    the layouts of :data:`FITTED` for the costs they fit (where there are two ranks or more and the model has the blocks for
    its chunks; otherwise that cost keeps its default)."""
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
    others = [(build_schedule(name, ranks, microbatches, chunks), field_name) for name, chunks, field_name in FITTED
              if ranks > 1 and md.num_blocks >= chunks * ranks]  # each stage needs a block
    blocks = tuple(balanced_block_counts(md.block_costs, schedule))  # as the run splits them
    options = RuntimeOptions(seed=seed, timeout_s=timeout_s, dtype=parse_dtype(dtype))
    result = run(TrainConfig(model, schedule, steps, batch_size, options, block_counts=blocks, model_size=size,
                             alongside=tuple(s for s, _ in others)))
    steps_measured = result.timelines[1:]
    measured = median_costs(steps_measured)
    stage_costs = tuple(
        (measured[(s, Op.F)], measured[(s, Op.I)], measured[(s, Op.W)]) for s in range(schedule.stages)
    )
    prof = Profile(
        model=model, ranks=ranks, microbatches=microbatches, batch_size=batch_size,
        num_blocks=md.num_blocks, stage_costs=stage_costs,
        comm=calibrated_comm(schedule, steps_measured, result.comm_latency), latency=result.comm_latency,
        stage_memory=tuple(result.stage_memory[s] for s in range(schedule.stages)),
        step_time=result.median_step_time(), model_size=size, stage_blocks=blocks, dtype=dtype,
    )
    # the layouts took turns with the profiled ZB-H1 (the first): ratios of one round, then the median
    bases, *turns = result.alongside_timelines or [[]]
    for (other, field_name), timelines in zip(others, turns):
        ratio = statistics.median(makespan(t) / makespan(b) for t, b in zip(timelines, bases))
        value = fitted_cost(schedule, other, prof.costs(), field_name, ratio)
        prof = replace(prof, ratios={**prof.ratios, other.name: ratio}, **{field_name: value / MS})
    return prof


def fitted_cost(one: "Schedule", other: "Schedule", costs: Costs, field_name: str, ratio: float) -> float:
    """The value of ``costs``' field ``field_name`` (``stage_overhead`` or ``full_backward``, in
    ``costs``' unit) with which ``other``'s simulated makespan is ``ratio`` times ``one``'s (one
    ZB-H1 step, whose one stage per rank and split backward neither field changes), within the
    field's range: a stage overhead from 0 to 0.9 of the smaller of F and B (the part of them it
    can be), a full backward from half to twice ``B + W`` (beyond, the profile measured something
    else); at a bound where the ratio lies beyond it."""
    base = simulate(one, costs).makespan

    def simulated_ratio(value: float) -> float:
        return simulate(other, replace(costs, **{field_name: value})).makespan / base

    if field_name == "stage_overhead":
        lo, hi = 0.0, 0.9 * min(costs.F, costs.B)
    else:
        lo, hi = max(0.5 * (costs.B + costs.W), 1.01 * costs.stage_overhead), 2.0 * (costs.B + costs.W)
    if simulated_ratio(lo) >= ratio:
        return lo
    if simulated_ratio(hi) <= ratio:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if simulated_ratio(mid) < ratio else (lo, mid)
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
    dtype: str = "fp32", timeout_s: float = DEFAULT_TIMEOUT_S,
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
