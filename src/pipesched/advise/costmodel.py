"""What a candidate costs before it is simulated: its ``Costs`` and its memory limit.

The advisor compares schedules that may differ in chunk count (so in the number of stages) and,
when the global batch is fixed, in microbatch count. A cost model answers, for one such setting,
"what are F, B, W, comm and the stage multipliers" and "how many M_B units may a rank hold".

Microbatch size and ``scale``: costs are given for a reference microbatch of ``b`` samples. A
candidate that splits the same global batch into ``m'`` microbatches uses microbatches of
``b' = G / m'`` samples, ``scale = b' / b``. Compute, activations and p2p volume grow linearly
with the samples in a microbatch, so per-action times and ``comm`` are multiplied by ``scale``
(minus a fixed ``overhead`` per action that does not shrink), and one of the candidate's M_B
units holds ``scale`` reference units: its limit is ``memory_limit / scale``. Every candidate
then processes the same ``G`` samples per iteration, so their makespans are directly comparable
(time per iteration = time per ``G`` samples).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Protocol

from ..costs import Costs
from ..errors import ConfigError
from ..memory import MemorySizes, StageMemory


class CostModel(Protocol):
    """Costs and memory limit of one candidate setting (see the module docstring)."""

    def costs(self, stages: int, placement: str, scale: float) -> Costs:
        """Per-microbatch costs for ``stages`` stages at ``scale`` times the reference size."""

    def memory_limit(self, stages: int, placement: str, scale: float) -> Optional[float]:
        """Peak activations a rank may hold, in the candidate's M_B units (None: no limit)."""

    def layers_per_stage(self, stages: int, placement: str) -> Optional[tuple[int, ...]]:
        """How many layers each stage gets under this placement (None when the model's layers
        are unknown)."""

    def layer_assignments(self, stages: int, placement: str) -> tuple[str, ...]:
        """Names of the layer assignments that give this layout different splits, this model's
        own first (fewer than two: nothing to choose)."""

    def with_layer_assignment(self, name: str) -> "CostModel":
        """The same model with its layers given to stages the ``name`` way."""

    def memory_gb(self, stages: int, placement: str, scale: float, peaks: tuple[float, ...]) -> Optional[float]:
        """Largest memory over ranks in GB for these per-rank peaks (None when unknown)."""

    def stage_sizes(self, stages: int, placement: str, scale: float) -> Optional[MemorySizes]:
        """Per-stage bytes (None when activation sizes are unknown)."""

    def state_bytes(self, stages: int, placement: str) -> tuple[float, ...]:
        """Bytes per rank held besides activations (weights, gradients, optimizer state)."""

    def activation_budgets(self, stages: int, placement: str) -> Optional[tuple[float, ...]]:
        """Activation bytes each rank may hold (None: no limit in bytes; with one, recomputation
        becomes a choice)."""

    def limits_device_memory(self) -> bool:
        """Whether the limit is a device's whole memory (weights and optimizer state included)."""

    time_unit: str  # of the costs: "ms", or "" for cost units


@dataclass(frozen=True)
class ScaledCosts:
    """Costs given directly (``--costs F,B,W``) at the reference microbatch size.

    ``overhead`` is the part of each F, B and W that does not shrink with the microbatch (kernel
    launches, fixed latencies); of F and B at least the base's ``stage_overhead`` (a stage's host work)
    stays too. ``comm`` is taken as bandwidth-bound, so it scales fully.
    ``activation`` (measured by a profile): one reference microbatch's bytes for the whole model,
    kept by F and stashed for W, and one stage boundary's, shared evenly by the stages; with it
    a limit may be in bytes (``limit_bytes``) and recomputation becomes a choice.
    """

    base: Costs
    limit: Optional[float] = None
    overhead: float = 0.0
    activation: Optional[tuple[float, float, float]] = None  # whole model's keep, stash; a boundary's bytes
    limit_bytes: Optional[float] = None  # activation bytes per rank
    ranks: int = 1  # the ranks that share the model's activations (with ``activation``)
    time_unit: str = ""  # of ``base``: "" (cost units) or "ms" (measured)

    def __post_init__(self) -> None:
        smallest = min(self.base.F, self.base.B, self.base.W)
        if not 0 <= self.overhead < smallest:
            raise ConfigError(
                f"overhead={self.overhead:g} must be at least 0 and below the smallest of F, B, W ({smallest:g})"
            )
        if self.limit is not None and not self.limit > 0:
            raise ConfigError(f"memory limit must be above 0, got {self.limit:g}")
        if self.limit_bytes is not None and self.activation is None:
            raise ConfigError("a memory limit in bytes needs the activation size per microbatch "
                              "(a model description or --profile): give it in M_B units")

    def costs(self, stages: int, placement: str, scale: float) -> Costs:
        if scale == 1.0:
            return self.base
        b = self.base
        o = self.overhead
        fixed = max(o, b.stage_overhead)  # a stage's own host work does not shrink with the microbatch either

        def scaled(x: float, part: float) -> float:
            return part + (x - part) * scale

        full = None if b.full_backward is None else scaled(b.full_backward, fixed)
        return replace(b, F=scaled(b.F, fixed), B=scaled(b.B, fixed), W=scaled(b.W, o), comm=b.comm * scale,
                       full_backward=full)

    def memory_limit(self, stages: int, placement: str, scale: float) -> Optional[float]:
        if self.limit_bytes is not None and self.activation is not None:  # M_B: a rank's share
            return self.limit_bytes / (self.activation[0] / self.ranks) / scale
        return None if self.limit is None else self.limit / scale

    def stage_sizes(self, stages: int, placement: str, scale: float) -> Optional[MemorySizes]:
        if self.activation is None:
            return None
        keep, stash, boundary = (x * scale for x in self.activation)
        return MemorySizes((StageMemory(keep / stages, stash / stages),) * stages, (boundary,) * stages)

    def state_bytes(self, stages: int, placement: str) -> tuple[float, ...]:
        return (0.0,) * self.ranks  # not known from costs alone

    def activation_budgets(self, stages: int, placement: str) -> Optional[tuple[float, ...]]:
        return None if self.limit_bytes is None else (self.limit_bytes,) * self.ranks

    def limits_device_memory(self) -> bool:
        return False

    def layers_per_stage(self, stages: int, placement: str) -> Optional[tuple[int, ...]]:
        return None

    def layer_assignments(self, stages: int, placement: str) -> tuple[str, ...]:
        return ()

    def with_layer_assignment(self, name: str) -> "ScaledCosts":
        return self

    def memory_gb(self, stages: int, placement: str, scale: float, peaks: tuple[float, ...]) -> Optional[float]:
        return None
