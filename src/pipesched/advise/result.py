"""What the advisor returns: the simulated candidates, ranked, and the recommendation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..costs import Costs
from .candidates import BatchPlan


@dataclass(frozen=True)
class Candidate:
    """One simulated configuration, with what ``build_schedule`` needs to rebuild it."""

    schedule: str
    chunks: int
    microbatches: int
    microbatch_size: Optional[int]
    memory_limit: Optional[float]  # pass to build_schedule (this candidate's M_B units)
    costs: Costs  # pass to build_schedule and simulate
    makespan: float
    span: float
    bubble_ratio: float
    peak_memory: float  # largest over ranks, this candidate's M_B units
    peak_per_rank: tuple[float, ...]
    scale: float  # this microbatch's size over the reference one
    fits: bool
    limit: Optional[float] = None  # the limit it was held to (its own units), None: no limit
    placement: str = "loop"
    messages: int = 0  # cross-rank transfers per microbatch in each direction
    speedup_vs_1f1b: Optional[float] = None
    layers_per_stage: Optional[tuple[int, ...]] = None
    layer_assignment: Optional[str] = None  # how a rank's layers went to its stages, when that was a choice
    memory_gb: Optional[float] = None
    objective: Optional[str] = None  # pass to build_schedule for families that search by it
    recompute: str = "none"  # "all": every stage recomputes its activations in the backward
    peak_memory_bytes: Optional[float] = None  # fullest rank: activations plus what the model counts besides
    activation_bytes: Optional[float] = None  # fullest rank's activations alone
    memory_counted: Optional[str] = None  # what peak_memory_bytes (and a limit in bytes) counts
    # what the search's ``price`` hook made of this candidate's simulation (a layout search: its
    # members' rows), kept so that nothing is built twice
    priced: tuple = field(default=(), repr=False, compare=False)

    @property
    def peak_memory_reference(self) -> float:
        """Peak in the reference microbatch's M_B units (comparable across microbatch sizes)."""
        return self.peak_memory * self.scale

    def value(self, objective: str) -> float:
        return self.makespan if objective == "makespan" else self.span

    def label(self) -> str:
        extra = ", recompute all" if self.recompute != "none" else ""
        return f"{self.schedule} (chunks={self.chunks}, m={self.microbatches}{extra})"

    def to_json(self) -> dict:
        c = self.costs
        return {
            "schedule": self.schedule,
            "chunks": self.chunks,
            "microbatches": self.microbatches,
            "microbatch_size": self.microbatch_size,
            "memory_limit": self.memory_limit,
            "costs": {
                "F": c.F, "B": c.B, "W": c.W, "comm": c.comm, "stage_overhead": c.stage_overhead,
                "full_backward": c.full_backward, "overlap": c.overlap,
                "stage_multipliers": list(c.stage_multipliers) if c.stage_multipliers else None,
            },
            "makespan": self.makespan,
            "span": self.span,
            "bubble_ratio": self.bubble_ratio,
            "peak_memory": self.peak_memory,
            "peak_memory_per_rank": list(self.peak_per_rank),
            "peak_memory_reference": self.peak_memory_reference,
            "memory_scale": self.scale,
            "fits": self.fits,
            "speedup_vs_1f1b": self.speedup_vs_1f1b,
            "layers_per_stage": list(self.layers_per_stage) if self.layers_per_stage else None,
            "layer_assignment": self.layer_assignment,
            "memory_gb": self.memory_gb,
            "messages_per_microbatch": self.messages,
            "objective": self.objective,
            "recompute": self.recompute,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_memory_bytes_counts": self.memory_counted,
        }


@dataclass(frozen=True)
class Advice:
    """The ranked candidates, the recommendation and why."""

    ranks: int
    objective: str
    memory_limit: Optional[float]  # reference M_B units, None: no limit
    plan: BatchPlan
    candidates: tuple[Candidate, ...]  # best first; those that fit come first
    baseline: Optional[Candidate]  # 1f1b at the reference microbatch count
    reason: str = ""
    notes: tuple[str, ...] = ()
    skipped: tuple[tuple[str, int, int, str], ...] = field(default=())  # (schedule, chunks, m, why)
    searched: str = "in full"  # every candidate of the plan built and simulated (no search is narrowed)
    time_unit: str = ""  # of the costs and times: "ms" (a model description, a profile) or "" (cost units)

    @property
    def recommended(self) -> Candidate:
        return self.candidates[0]

    @property
    def fitting(self) -> list[Candidate]:
        return [c for c in self.candidates if c.fits]

    def to_json(self) -> list[dict]:
        return [c.to_json() for c in self.candidates]
