"""Sizing both dimensions: G GPUs as ``pp`` pipeline stages x ``dp`` data-parallel replicas.

For every ``pp`` dividing G (``dp = G / pp``), each replica trains ``global_batch / dp`` samples
per step with a ``pp``-rank pipeline; the advisor ranks that pipeline's schedules, chunk and
microbatch counts as usual (:func:`~pipesched.advise.search.advise`, memory per rank from the
model: parameters and optimizer state of its stages are replicated, not sharded, across ``dp``).
Then the data-parallel all-reduce of each stage's gradients joins the simulated timeline
(:func:`gradient_sync`): it starts when the stage's last ``W`` (or ``B``) ends, as the runtime
starts it, runs one stage after another on the rank's link to its replicas, and costs a ring
all-reduce's ``latency + 2 (dp-1)/dp x bytes / bandwidth``. Only the part that outlasts the
rank's compute is exposed; the step ends when the last rank's reduction does. Candidates are
ranked by that predicted time per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import compress
from operator import itemgetter
from typing import Callable, Optional, Sequence

from ..errors import ConfigError, PipeschedError
from ..registry import build_schedule, get_family
from ..execution import Span
from ..ops import Op
from ..simulate import simulate
from .estimate import GB, TransformerCosts
from .candidates import microbatch_options
from .search import Advice, Candidate, advise, objective_option

GRAD_BYTES = 2  # bf16 gradients, as the memory model's 16 bytes per parameter assume
BUCKET_BYTES = 25 << 20  # the runtime's (and DDP's) bucket size
DEFAULT_DP_LATENCY_MS = 0.05


@dataclass(frozen=True)
class AllReduceCost:
    """A ring all-reduce over ``replicas`` ranks: ``latency`` per bucket, ``bandwidth`` in bytes
    per time unit (the units of the schedule's costs)."""

    replicas: int
    bandwidth: float
    latency: float = 0.0
    bucket_bytes: float = BUCKET_BYTES

    def time(self, nbytes: float) -> float:
        if self.replicas == 1 or nbytes <= 0:
            return 0.0
        buckets = max(1, math.ceil(nbytes / self.bucket_bytes))
        return buckets * self.latency + 2 * (self.replicas - 1) / self.replicas * nbytes / self.bandwidth


@dataclass(frozen=True)
class SyncedStep:
    """A simulated step with its gradient all-reduces: when each rank's last one ends."""

    step_time: float  # the last rank's end (compute or reduction, whichever is later) plus the closing
    exposed: float  # the last rank's end minus the pipeline's makespan: reduction that did not hide
    reduce_spans: tuple[tuple[tuple[int, float, float], ...], ...]  # per rank: (stage, start, end)


_ADDS_WEIGHT_GRADS = frozenset(kind for kind in Op if kind.adds_weight_grads)


def gradient_sync(
    timeline: Sequence[Sequence[Span]],
    stage_bytes: Sequence[float],
    cost: AllReduceCost,
    overlap: bool = True,
    closing: float = 0.0,
    shift: float = 0.0,
) -> SyncedStep:
    """Add the all-reduce of each stage's gradients to a step's ``timeline`` (per rank, its spans
    from time 0: a simulation's, or a replay of measured costs); see the module doc.

    ``overlap=False``: every reduction waits for the rank's last action (the runtime's baseline).
    ``closing``: what the step does once every rank's gradients are reduced (the runtime agrees
    on the loss across all ranks, which lines them up, then steps the optimizer and checks the
    weights), added after the last rank's end. ``shift``: every span taken as starting that much
    later (FSDP's first all-gathers hold the whole pipeline back): the times are those of the
    moved spans, without copying the timeline (``max(x) + d`` is ``max(x + d)`` in floats too)."""
    ends, spans, last = [], [], []
    for rank_spans in timeline:
        actions, span_ends = list(map(itemgetter(0), rank_spans)), list(map(itemgetter(2), rank_spans))
        compute_end = max(span_ends) + shift if span_ends else 0.0
        if span_ends:
            last.append(compute_end)  # the makespan: the latest end of any span
        # a stage's gradients are final after its last W or B: pairs into a dict keep the last (C loops, 10^5+ spans)
        adds = list(map(_ADDS_WEIGHT_GRADS.__contains__, map(itemgetter(1), actions)))
        ready = dict(zip(compress(map(itemgetter(0), actions), adds), compress(span_ends, adds)))
        if shift:
            ready = {stage: at + shift for stage, at in ready.items()}
        free = 0.0
        mine = []
        for stage, at in sorted(ready.items(), key=lambda kv: (kv[1], kv[0])):
            start = max(free, at if overlap else compute_end)
            free = start + cost.time(stage_bytes[stage])
            mine.append((stage, start, free))
        spans.append(tuple(mine))
        ends.append(max(compute_end, free))
    reduced = max(ends)
    makespan = max(last, default=0.0)
    return SyncedStep(reduced + closing, reduced - makespan, tuple(spans))


def stage_gradient_bytes(model: TransformerCosts, stages: int, placement: str) -> list[float]:
    """Gradient bytes of each stage: its layers, and the embedding and head at the ends."""
    spec = model.spec
    counts = model.layers_per_stage(stages, placement)
    out = [GRAD_BYTES * n * spec.layer_params for n in counts]
    out[0] += GRAD_BYTES * spec.embedding_params
    out[-1] += GRAD_BYTES * spec.embedding_params
    return out


@dataclass(frozen=True)
class LayoutCandidate:
    """One (pp, dp) layout with one of its pipeline's candidates, and the predicted step."""

    pp: int
    dp: int
    candidate: Candidate
    step_time: float  # ms, with the exposed all-reduce
    exposed_allreduce: float  # ms
    allreduce_per_rank: float  # ms of reduction on the busiest rank, hidden or not
    searched: str = "in full"  # how its layout was searched (Advice.searched)
    tp: int = 1
    dp_shard: int = 1
    exposed_gather: float = 0.0  # ms the step waited for FSDP's all-gathers
    gather_per_rank: float = 0.0  # ms of all-gathers on the busiest rank, hidden or not
    # per pipeline rank (its fullest shard): RankBytes's fields and its peak "activations", bytes
    bytes_per_rank: tuple[dict, ...] = ()
    # 1 - the busiest rank's compute over the makespan: the fill and drain of the rank that sets the
    # pace (Megatron-LM's (p-1)/(v m)); the rest of ``candidate.bubble_ratio`` is the lighter ranks
    # waiting for it (a stage holding the head besides its layers). None: not priced on a timeline
    pipeline_bubble: Optional[float] = None
    ep: int = 1  # expert parallelism: ranks of a stage's data-parallel ones splitting the routed experts

    def label(self) -> str:
        sharded = f" x dp_shard={self.dp_shard} x tp={self.tp}" if (self.tp, self.dp_shard) != (1, 1) else ""
        experts = f" x ep={self.ep}" if self.ep > 1 else ""  # the free search tries several per layout
        return f"pp={self.pp} x dp={self.dp}{sharded}{experts}: {self.candidate.label()}"

    def to_json(self) -> dict:
        return {
            "pp": self.pp,
            "dp": self.dp,
            "dp_shard": self.dp_shard,
            "tp": self.tp,
            "ep": self.ep,
            **self.candidate.to_json(),
            "step_time": self.step_time,
            "exposed_allreduce": self.exposed_allreduce,
            "allreduce_per_rank": self.allreduce_per_rank,
            "searched": self.searched,
            "exposed_gather": self.exposed_gather,
            "gather_per_rank": self.gather_per_rank,
            **({"bytes_per_rank": list(self.bytes_per_rank)} if self.bytes_per_rank else {}),
            **({"pipeline_bubble": self.pipeline_bubble} if self.pipeline_bubble is not None else {}),
        }


@dataclass(frozen=True)
class LayoutAdvice:
    gpus: int
    global_batch: int
    candidates: tuple[LayoutCandidate, ...]  # fastest first
    per_layout: tuple[Advice, ...]
    skipped: tuple[str, ...] = ()
    searched: tuple[str, ...] = ()  # how each layout was searched, where per_layout does not say (whole layouts)
    priced: int = 0  # candidates simulated and priced (whole layouts: each for every member of its group)

    @property
    def recommended(self) -> LayoutCandidate:
        return self.candidates[0]

    def baseline(self, pp: int, dp: int, tp: int = 1, dp_shard: int = 1) -> Optional[LayoutCandidate]:
        """1F1B at the same layout (the fastest 1F1B setting the search kept)."""
        return next((c for c in self.candidates if (c.pp, c.dp, c.tp, c.dp_shard) == (pp, dp, tp, dp_shard)
                     and c.candidate.schedule == "1f1b"), None)

    def to_json(self) -> list[dict]:
        return [c.to_json() for c in self.candidates]

    def searched_lines(self) -> list[str]:
        """How each layout's pipeline was searched (in full, at which microbatch counts)."""
        if self.searched:
            return list(self.searched)
        return [f"pp={a.ranks} x dp={self.gpus // a.ranks}: {a.searched}" for a in self.per_layout]


def advise_layouts(
    gpus: int,
    model: TransformerCosts,
    global_batch: int,
    *,
    dp_bandwidth: Optional[float] = None,
    dp_latency_ms: float = DEFAULT_DP_LATENCY_MS,
    pp_options: Optional[Sequence[int]] = None,
    keep: int = 6,
    layouts_done: Optional[Callable[[int, int], None]] = None,
    **advise_options,
) -> LayoutAdvice:
    """Rank (pp, dp, schedule, chunks, microbatches) for ``gpus`` GPUs by predicted time per step.

    ``model`` describes the model and hardware (its ``ranks`` is replaced by each ``pp``);
    ``dp_bandwidth`` (GB/s between replicas; default the model's pipeline bandwidth) and
    ``dp_latency_ms`` price the all-reduce. The ``keep`` fastest fitting candidates of each
    layout (and its 1F1B) are rebuilt and simulated with the reduction on their timeline.
    Each layout's pipeline is searched in full (every family, chunk count and recomputation
    choice) at the microbatch count the model's microbatch size gives, other counts only where
    ``max_microbatches`` opens them (:func:`~.candidates.microbatch_options`): no time budget
    narrows it, so no verdict depends on how far a search went. ``layouts_done(done, total)``
    hears of each layout searched (a progress line)."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"--gpus must be a whole number of at least 1, got {gpus!r}")
    bandwidth = dp_bandwidth if dp_bandwidth is not None else model.hardware.bandwidth
    if bandwidth is None:
        raise ConfigError("pricing the data-parallel all-reduce needs --dp-bandwidth or --bandwidth (GB/s)")
    layouts = pp_options or [p for p in range(1, gpus + 1) if gpus % p == 0 and p <= model.spec.layers]
    ranked: list[LayoutCandidate] = []
    per_layout: list[Advice] = []
    skipped: list[str] = []
    for done, pp in enumerate(layouts, 1):
        if layouts_done is not None and done > 1:
            layouts_done(done - 1, len(layouts))
        dp = gpus // pp
        if global_batch % dp or (global_batch // dp) % model.spec.microbatch_size:
            skipped.append(f"pp={pp} x dp={dp}: global batch {global_batch} does not split into {dp} replicas "
                           f"of whole microbatches of {model.spec.microbatch_size}")
            continue
        pipeline = replace(model, ranks=pp)
        try:
            advice = advise(pp, cost_model=pipeline, refuse_slow=False,
                            **microbatch_options(global_batch // dp, model.spec.microbatch_size, advise_options))
        except PipeschedError as err:
            skipped.append(f"pp={pp} x dp={dp}: {err}")
            continue
        per_layout.append(advice)
        cost = AllReduceCost(dp, bandwidth * GB / 1e3, dp_latency_ms)  # bytes per ms
        shortlist = advice.fitting[:keep]
        shortlist += [c for c in advice.fitting if c.schedule == "1f1b" and c not in shortlist][:1]
        for c in shortlist:
            ranked.append(replace(_with_sync(pp, dp, c, pipeline, cost), searched=advice.searched))
    if not ranked:
        raise ConfigError(f"no layout of {gpus} GPUs fits: " + "; ".join(skipped[:3]))
    ranked.sort(key=lambda c: (c.step_time, c.candidate.peak_memory_reference, c.dp))
    return LayoutAdvice(gpus, global_batch, tuple(ranked), tuple(per_layout), tuple(skipped))


def _with_sync(pp: int, dp: int, c: Candidate, model: TransformerCosts, cost: AllReduceCost) -> LayoutCandidate:
    family = get_family(c.schedule)
    schedule = build_schedule(c.schedule, pp, c.microbatches, c.chunks, c.costs, c.memory_limit,
                              **objective_option(family, c.objective or "makespan"))
    if c.layer_assignment is not None:  # the split the candidate was costed with
        model = model.with_layer_assignment(c.layer_assignment)
    sizes = model.stage_sizes(schedule.stages, schedule.style, c.scale) if c.recompute == "all" else None
    # a recomputing candidate is timed recomputing, as the search timed it
    result = simulate(schedule, c.costs, sizes.with_recompute(frozenset(range(schedule.stages))) if sizes else None)
    synced = gradient_sync(result.timeline, stage_gradient_bytes(model, schedule.stages, schedule.style), cost)
    busiest = max((sum(e - s for _, s, e in spans) for spans in synced.reduce_spans), default=0.0)
    return LayoutCandidate(pp, dp, c, synced.step_time, synced.exposed, busiest)
