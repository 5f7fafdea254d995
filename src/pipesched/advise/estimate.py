"""Costs and memory of a pipeline from a transformer's description, on given hardware.

:class:`TransformerCosts` lays :class:`~.transformer.TransformerSpec`'s per-layer figures (the
Zero Bubble paper's formulas, in :mod:`.transformer`) out over a pipeline's stages. The first
stage also holds the token embedding and the last the output head. Either end's stage may hold
its embedding or head alone (Megatron-LM's ``--account-for-embedding-in-pipeline-split`` and
``--account-for-loss-in-pipeline-split``; what the Zero Bubble code's padding of ``k*p - 2``
layers gives at one layer per chunk). Parameters and optimizer state take 16 bytes per parameter
(bf16 weights and gradients, fp32 master weights and Adam's two moments). Times use ``tflops``
(effective, not peak) and ``bandwidth`` (GB/s, 1 GB = 1e9 bytes); times are in ms.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Optional, Sequence

from ..balance import balance_layers
from ..costs import Costs
from ..errors import ConfigError
from ..memory import MemorySizes, StageMemory
from ..parallel_layout import ParallelLayout
from ..placement import loop_placement, v_placement
from ..sharded_bytes import ADAM_SLOTS, MASTER_BYTES, RankBytes
from .transformer import TransformerSpec
from .transformer_bytes import transformer_rank_bytes

BYTES_PER_PARAM = (2 + ADAM_SLOTS) * MASTER_BYTES  # parameter, gradient, Adam's moments (besides its steps)
DEFAULT_TFLOPS = 150.0  # roughly an A100's bf16 peak at half utilisation
GB = 1e9


@dataclass(frozen=True)
class Hardware:
    """What turns FLOPs, bytes and parameters into milliseconds and a memory limit."""

    tflops: float = DEFAULT_TFLOPS  # effective TFLOP/s per device
    bandwidth: Optional[float] = None  # GB/s between pipeline neighbours; None: comm not modelled
    gpu_memory: Optional[float] = None  # GB per device; None: use the M_B limit given instead

    def __post_init__(self) -> None:
        for label in ("tflops", "bandwidth", "gpu_memory"):
            value = getattr(self, label)
            if value is not None and not (isinstance(value, (int, float)) and value > 0 and value < float("inf")):
                raise ConfigError(f"{label.replace('_', ' ')} must be a number above 0, got {value!r}")


LAYER_ASSIGNMENTS = ("heavy-early", "heavy-late")
"""Ways to give a rank's layers to its stages when it holds several (see :func:`orient_layers`).
Two more were tried on the Zero Bubble paper's models (Megatron's group of p) and never won:
heavy-early on even ranks and heavy-late on odd ones, and balancing each stage on its own."""


def orient_layers(
    counts: Sequence[int], rank_of_stage: Sequence[int], movable: Sequence[bool], assignment: str,
) -> tuple[int, ...]:
    """``counts`` (balanced per rank) with each rank's layers moved between its ``movable`` stages.

    A rank's stages that hold only layers (not the head; and not a stage holding the embedding
    or the head alone) may share its layers in any order without changing the rank's total or
    the slowest stage. Which chunk is the heavier changes when each rank's work becomes ready
    for the next, so no one order is fastest for every schedule (interleaved 1F1B's groups of
    ``p`` microbatches move through one chunk before the next). ``heavy-early``: a rank's
    heavier stages first in model order; ``heavy-late``: last.
    """
    out = list(counts)
    late = assignment == "heavy-late"
    for r in sorted(set(rank_of_stage)):
        mine = [s for s in range(len(out)) if rank_of_stage[s] == r and movable[s]]
        for s, n in zip(mine, sorted((out[s] for s in mine), reverse=not late)):
            out[s] = n
    return tuple(out)


@dataclass(frozen=True)
class TransformerCosts:
    """A :class:`~pipesched.advise.costmodel.CostModel` estimated from a model description."""

    spec: TransformerSpec
    ranks: int
    hardware: Hardware = Hardware()
    limit: Optional[float] = None  # M_B units at the reference size, used without gpu_memory
    # bytes per rank of everything the model counts (--memory-limit 40GiB): weights, gradients,
    # optimizer state and activations, as gpu_memory counts them
    memory_bytes: Optional[float] = None
    layer_assignment: str = LAYER_ASSIGNMENTS[0]  # with several stages per rank: which takes the extra layers
    time_unit: str = "ms"  # every time this model gives

    def __post_init__(self) -> None:
        given = [x for x in (self.hardware.gpu_memory, self.limit, self.memory_bytes) if x is not None]
        if len(given) > 1:
            raise ConfigError("give one memory limit: GPU memory, M_B units or bytes")
        if self.layer_assignment not in LAYER_ASSIGNMENTS:
            raise ConfigError(f"layer assignment {self.layer_assignment!r} is not known: use one of "
                              f"{', '.join(LAYER_ASSIGNMENTS)}")

    def _ms(self, flops: float) -> float:
        return 1e3 * flops / (self.hardware.tflops * 1e12)

    def layer_times(self, scale: float = 1.0, experts: bool = True) -> tuple[float, float, float]:
        """F, B, W of one layer in ms (``experts=False``: one of the first dense layers)."""
        b = self.spec.microbatch_size * scale
        return tuple(self._ms(x) for x in self.spec.layer_flops(b, experts))  # type: ignore[return-value]

    def head_time(self, scale: float = 1.0) -> float:
        """Each of the head's F, B and W in ms."""
        return self._ms(self.spec.head_flops(self.spec.microbatch_size * scale))

    def embedding_time(self, scale: float = 1.0) -> float:
        """Each of the embedding's F, B and W in ms."""
        return self._ms(self.spec.embedding_flops(self.spec.microbatch_size * scale))

    def comm_ms(self, scale: float = 1.0) -> float:
        if self.hardware.bandwidth is None:
            return 0.0
        bytes_ = self.spec.p2p_bytes(self.spec.microbatch_size * scale)
        return 1e3 * bytes_ / (self.hardware.bandwidth * GB)

    def rank_of_stage(self, stages: int, placement: str) -> Optional[tuple[int, ...]]:
        """The stage-to-rank map of a loop or V placement (None for any other: the family picks)."""
        if placement == "v" and stages == 2 * self.ranks:
            return v_placement(self.ranks)
        if placement == "loop" and stages % self.ranks == 0:
            return loop_placement(self.ranks, stages // self.ranks)
        return None

    def layers_per_stage(self, stages: int, placement: str) -> tuple[int, ...]:
        """The layer split: balanced per rank for the placement's map and oriented by
        ``layer_assignment`` (:func:`orient_layers`); per stage without a map."""
        return _layer_split(self.spec.layers, stages, sum(self.layer_times()), 3 * self.embedding_time(),
                            3 * self.head_time(), self.rank_of_stage(stages, placement), self.layer_assignment)

    def layer_assignments(self, stages: int, placement: str) -> tuple[str, ...]:
        """The assignments that give this layout different splits, this model's own first
        (one name when a rank holds one stage, or the layers split evenly)."""
        splits = {}
        for name in (self.layer_assignment,) + LAYER_ASSIGNMENTS:
            splits.setdefault(self.with_layer_assignment(name).layers_per_stage(stages, placement), name)
        return tuple(splits.values())

    def with_layer_assignment(self, name: str) -> "TransformerCosts":
        """This model with its layers given to a rank's stages by ``name`` (see :func:`orient_layers`)."""
        return replace(self, layer_assignment=name)

    def costs(self, stages: int, placement: str, scale: float) -> Costs:
        counts = self.layers_per_stage(stages, placement)
        moe, dense = self.layer_times(scale), self.layer_times(scale, experts=False)
        head = self.head_time(scale)
        ends = head + self.embedding_time(scale)
        stage_time = [(n - d) * sum(moe) + d * sum(dense) for n, d in zip(counts, self.spec.dense_per_stage(counts))]
        stage_time[0] += 3 * self.embedding_time(scale)
        stage_time[-1] += 3 * head
        mean = sum(stage_time) / stages
        p, D = self.ranks, self.spec.dense_layers
        f, b, w = (((self.spec.layers - D) * x + D * y + ends) / p for x, y in zip(moe, dense))
        return Costs(
            F=f, B=b, W=w,
            comm=self.comm_ms(scale),
            stage_multipliers=tuple(t / mean for t in stage_time),
        )

    def _ranks_of(self, stages: int, placement: str) -> list[dict]:
        """Per rank: layers held (``dense`` of them the first dense ones), whether it holds the
        first / last stage."""
        where = v_placement(self.ranks) if placement == "v" else loop_placement(self.ranks, stages // self.ranks)
        counts = self.layers_per_stage(stages, placement)
        held = [{"layers": 0, "dense": 0, "first": False, "last": False} for _ in range(self.ranks)]
        for s, (r, d) in enumerate(zip(where, self.spec.dense_per_stage(counts))):
            held[r]["layers"] += counts[s]
            held[r]["dense"] += d
        held[where[0]]["first"] = True
        held[where[-1]]["last"] = True
        return held

    def rank_bytes(self, rank: dict) -> RankBytes:
        """Weights, gradients and optimizer state of one rank (``rank`` as :meth:`_ranks_of`
        describes it): Adam, all in fp32, one whole copy per pipeline rank."""
        return transformer_rank_bytes(self.spec, ParallelLayout(self.ranks), rank["layers"], rank["first"],
                                      rank["last"], ADAM_SLOTS)

    def _state_bytes(self, rank: dict) -> float:
        return self.rank_bytes(rank).total

    def stage_sizes(self, stages: int, placement: str, scale: float) -> MemorySizes:
        """Per-stage bytes for :mod:`pipesched.memory`: what a stage keeps, stashes, and its input."""
        b = self.spec.microbatch_size * scale
        counts = self.layers_per_stage(stages, placement)
        spec, dense = self.spec, self.spec.dense_per_stage(counts)
        keep = [(n - d) * spec.layer_activation_bytes(b) + d * spec.layer_activation_bytes(b, False)
                for n, d in zip(counts, dense)]
        stash = [(n - d) * spec.layer_stash_bytes(b) + d * spec.layer_stash_bytes(b, False) for n, d in zip(counts, dense)]
        keep[-1] += self.spec.head_activation_bytes(b)
        stash[-1] += self.spec.head_activation_bytes(b)
        return MemorySizes(tuple(StageMemory(k, w) for k, w in zip(keep, stash)), (self.spec.p2p_bytes(b),) * stages,
                           blocks=tuple(counts))

    def state_bytes(self, stages: int, placement: str) -> tuple[float, ...]:
        """Weights, gradients and optimizer state per rank, bytes."""
        return tuple(b.total for b in self.ranks_bytes(stages, placement))

    def ranks_bytes(self, stages: int, placement: str) -> tuple[RankBytes, ...]:
        """Each rank's :meth:`rank_bytes`, in rank order."""
        return tuple(self.rank_bytes(r) for r in self._ranks_of(stages, placement))

    def activation_budgets(self, stages: int, placement: str) -> Optional[tuple[float, ...]]:
        """Activation bytes each rank may hold: the limit in bytes (GPU memory, or a byte
        limit) less its weights, gradients and optimizer state (None: no limit in bytes)."""
        budget = self.budget_bytes()
        return None if budget is None else tuple(budget - x for x in self.state_bytes(stages, placement))

    def limits_device_memory(self) -> bool:
        return self.budget_bytes() is not None

    def budget_bytes(self) -> Optional[float]:
        """The limit in bytes on each rank's whole footprint (None: none in bytes)."""
        if self.hardware.gpu_memory is not None:
            return self.hardware.gpu_memory * GB
        return self.memory_bytes

    def _activation_bytes(self, rank: dict, scale: float) -> float:
        b, spec, dense = self.spec.microbatch_size * scale, self.spec, rank.get("dense", 0)
        return ((rank["layers"] - dense) * spec.layer_activation_bytes(b) + dense * spec.layer_activation_bytes(b, False)
                + rank["last"] * spec.head_activation_bytes(b))

    def memory_limit(self, stages: int, placement: str, scale: float) -> Optional[float]:
        budget = self.budget_bytes()  # one budget for all ranks, each less its own state
        if budget is None:
            return None if self.limit is None else self.limit / scale
        layouts = [(stages, placement)]
        if placement not in ("loop", "v"):  # the family picks its layout: hold it to the tighter one
            layouts = [(stages, "loop")] + ([(2 * self.ranks, "v")] if 2 * self.ranks <= self.spec.layers else [])
        return min(
            (budget - self._state_bytes(r)) / self._activation_bytes(r, scale)  # the rest is the state's
            for n, style in layouts
            for r in self._ranks_of(n, style)
            if self._activation_bytes(r, scale) > 0  # a rank holding the embedding alone keeps nothing
        )

    def memory_gb(self, stages: int, placement: str, scale: float, peaks: tuple[float, ...]) -> Optional[float]:
        held = self._ranks_of(stages, placement)
        return max(
            (self._state_bytes(r) + peak * self._activation_bytes(r, scale)) / GB
            for r, peak in zip(held, peaks)
        )

    def state_gb(self, stages: int, placement: str) -> float:
        """Parameters and optimizer state on the fullest rank, GB."""
        return max(self._state_bytes(r) for r in self._ranks_of(stages, placement)) / GB


@lru_cache(maxsize=1024)
def _layer_split(
    layers: int, stages: int, layer_cost: float, embedding_cost: float, head_cost: float,
    rank_of_stage: Optional[tuple[int, ...]], assignment: str,
) -> tuple[int, ...]:
    """:meth:`TransformerCosts.layers_per_stage`, kept: every cost and memory question of a
    candidate asks for it again."""
    # the embedding at its own (tiny) cost: a stage may hold it alone, and where ranks tie the
    # remainder layers go to others than the first, whose warm-up holds the most activations
    # (Megatron-LM's recipes give them to middle stages: docs/layouts.md, Megatron-Bridge)
    alone = embedding_cost > 0
    if rank_of_stage is None:
        return balance_layers(layers, stages, layer_cost, embedding_cost, head_cost, first_alone=alone)
    counts = balance_layers(layers, stages, layer_cost, embedding_cost, head_cost, rank_of_stage, alone)
    movable = [n > 0 and not (s == stages - 1 and head_cost > 0) for s, n in enumerate(counts)]
    return orient_layers(counts, rank_of_stage, movable, assignment)
