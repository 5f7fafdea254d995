"""Bytes a rank holds under a layout (pp x dp_replicate x dp_shard x tp), from parameter shapes.

The one place of these rules. Pure (no torch): the advisor predicts memory from the shapes a
transformer of given sizes has (:meth:`pipesched.advise.transformer.TransformerSpec.layer_specs`),
the runtime from the shapes of the modules it built
(:func:`pipesched.runtime.sharding.tp_plans.param_specs`), and the runtime's measured bytes are
checked against the same functions (tests/test_sharded_stages.py, tests/test_sharded_pipelines.py).

How a parameter is cut (what ``parallelize_module`` then ``fully_shard`` do in torch 2.13):

- tensor parallelism splits one dimension ``tp`` ways (a column-wise Linear its output rows, a
  row-wise Linear its input columns; :data:`TP_STYLES`), or none (norms, embeddings, the head:
  replicated on every ``tp`` rank);
- FSDP then splits dim 0 of the tensor-parallel piece ``dp_shard`` ways (dim 1 for the
  interleaved pieces of :data:`FUSED_STYLES`: the other dim);
- expert parallelism splits an MoE layer's stacked routed experts ``ep`` ways (dim 0)
  (``ParamSpec.expert``): the experts count once per EP group. Each rank's piece is held whole
  and left out of FSDP, or, where ``ParallelLayout.expert_shards`` is above 1, FSDP splits its
  dim 0 again over that many ranks holding the same experts (replicas beside them hold the same
  shards), gathering it like the rest.

Both cut as ``torch.chunk`` does: pieces of ``ceil(n / k)`` rows, the last ones shorter or empty,
so a rank's share depends on its coordinates. FSDP keeps each sharded parameter in a buffer
padded to the full ``ceil(n / k)`` rows, and reduce-scatters the gradients into one padded
buffer per group; the optimizer's state is allocated like the unpadded piece
(``zeros_like``), plus one scalar ``step`` per parameter (AdamW's, a 4-byte float).
Replicas (``dp_replicate``) hold whole copies of their shard: they change nothing here.

A rank's stages add up (:func:`rank_bytes`; Rajbhandari et al. 2020 for the states, torch's FSDP2
under pipelining for the rest): the sharded states of every local stage; with ``dp_shard > 1``
also the gathered window (torch's pipelining keeps a stage gathered from its first forward to
its last backward: torchtitan sets ``reshard_after_forward=False`` under PP), the full-size
gradients each stage accumulates from its first backward until its ``REDUCE_GRAD`` (pipelining
turns FSDP's reduce-scatter off for every microbatch but the end), and the flat all-gather output
and reduce-scatter input of the largest FSDP unit (a block), live while a collective runs. The
gathered and reduced widths are FSDP's ``MixedPrecisionPolicy`` (:class:`Precision`).
Activations are split ``tp`` ways under sequence parallelism; without it only the part inside
the attention and MLP blocks is (:func:`tp_activation_shares`).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Iterable, Optional, Sequence

from .parallel_layout import ParallelLayout

# style -> (weight dim, bias dim) split by tensor parallelism, for a Linear's (out, in) weight;
# a transposed Linear (GPT-2's Conv1D, weight (in, out)) splits the other weight dim; "rope_key"
# (DeepSeek's latent attention, runtime/sharding/tp_styles.py) splits nothing, it sums a gradient
TP_STYLES = {"colwise": (0, 0), "rowwise": (1, None), "rope_key": (None, None),
             # q/k norms between the two (runtime/sharding/tp_styles.py HeadsNorm): one weight for every
             # head, replicated; or a weight row per head or channel, split with the heads
             "head_norm": (None, None), "head_norm_heads_first": (None, None), "split_norm": (0, None),
             "rowwise_owned": (1, None), "colwise_fused2": (0, None), "colwise_fused3": (0, None)}
# styles whose weight FSDP shards on the dim tensor parallelism leaves whole: a Linear fusing equal
# projections (Phi-3's q|k|v, gate|up; GPT-2's Conv1D q|k|v) splits each one's output features (an
# interleaved placement, ``_StridedShard``), which torch 2.13's FSDP2 cannot shard again; it shards
# the input features instead (dim 1 of a Linear's weight, dim 0 of a Conv1D's)
FUSED_STYLES = frozenset({"colwise_fused2", "colwise_fused3"})
STEP_BYTES = 4  # AdamW's step counter, a float32 scalar tensor per parameter
MASTER_BYTES = 4  # FSDP2 keeps the sharded parameter (and so its gradient and Adam's moments) in fp32
ADAM_SLOTS = 2  # Adam's and AdamW's two moments per parameter
# of Korthikanti et al.'s 34sbh per layer, the norms', residuals' and dropout inputs: not split by
# tensor parallelism without sequence parallelism
OUTSIDE_BLOCKS_SHARE = 10 / 34


@dataclass(frozen=True)
class ParamSpec:
    """One parameter as the planner sees it: its full shape, the dim tensor parallelism splits
    (None: replicated across ``tp``) and its bytes per element."""

    shape: tuple[int, ...]
    tp_dim: Optional[int] = None
    element_bytes: int = 4
    fsdp_dim: int = 0  # the dim FSDP splits (:data:`FUSED_STYLES`; it splits a dim other than 0 only evenly)
    expert: bool = False  # routed experts stacked on dim 0: split ``ep`` ways, then ``expert_shards`` ways by FSDP


@dataclass(frozen=True)
class Precision:
    """How the data-parallel ranks keep a stage: bytes per element of a gathered (compute)
    parameter and of an unsharded gradient, FSDP2's ``MixedPrecisionPolicy`` (``param_dtype``,
    ``reduce_dtype``; None: the parameter's own), and whether the sharding is FSDP's or, with
    ``zero1``, Megatron-LM's distributed optimizer (ZeRO stage 1).

    ZeRO-1 shards only the fp32 master weights and the optimizer state over ``dp_shard``; the
    compute weights and the gradient buffer stay whole on every rank for the whole step (Megatron
    allocates both once), the gradients are reduce-scattered in place in that buffer (the
    optimizer reads its shard of it: there is no sharded gradient) and the updated weights
    all-gathered in place (no collective buffers). Megatron-LM's ``docs/distrib_optimizer.md``
    counts it as ``6 + 12/d`` bytes per parameter with bf16 weights and fp32 gradients; FSDP
    under pipelining holds ``6 + 16/d``, its sharded fp32 gradient besides, and a block's
    collective buffers. The traffic is the same: one gather and one reduction per stage and step."""

    gathered: Optional[int] = None
    unsharded_grad: Optional[int] = None
    zero1: bool = False


MIXED = Precision(gathered=2, unsharded_grad=4)  # torchtitan's: bf16 compute, fp32 reduce
ZERO1 = Precision(gathered=2, unsharded_grad=4, zero1=True)  # Megatron's bf16 weights, fp32 gradient buffer
FP32 = Precision()  # no policy: everything in the parameter's dtype (the runtime's runs)


@dataclass(frozen=True)
class StateBytes:
    """Bytes one rank holds for a stage, between steps (sharded) and while gathered."""

    params: int  # sharded parameters (FSDP's padded buffers)
    grads: int  # sharded gradients after the reduce-scatter (padded)
    optimizer: int  # optimizer state (``slots`` tensors like each piece, plus the step scalars)
    gathered_params: int  # the stage's parameters all-gathered (inside the unshard window)
    unsharded_grads: int  # full-size gradients held from the first backward until REDUCE_GRAD

    @property
    def steady(self) -> int:
        """What stays between steps: parameters, gradients and optimizer state."""
        return self.params + self.grads + self.optimizer

    def __add__(self, other: StateBytes) -> StateBytes:
        return StateBytes(*(a + b for a, b in zip(_fields(self), _fields(other))))

    def times(self, n: int) -> StateBytes:
        """``n`` stages (or units) like this one."""
        return StateBytes(*(n * a for a in _fields(self)))


NOTHING = StateBytes(0, 0, 0, 0, 0)


def _fields(b: StateBytes) -> tuple[int, ...]:
    return b.params, b.grads, b.optimizer, b.gathered_params, b.unsharded_grads


def tp_dims(style: str, transposed: bool = False) -> tuple[Optional[int], Optional[int]]:
    """(weight dim, bias dim) that tensor-parallel ``style`` splits (None: replicated)."""
    weight, bias = TP_STYLES[style]
    return (1 - weight if transposed else weight), bias


def chunk_rows(n: int, k: int, i: int) -> int:
    """Rows piece ``i`` of ``torch.chunk(n rows, k)`` holds (pieces of ``ceil(n/k)``, then what is left)."""
    size = -(-n // k)
    return max(0, min(size, n - i * size))


def tp_piece(spec: ParamSpec, tp: int, tp_rank: int) -> tuple[int, ...]:
    """The shape of ``spec`` on tensor-parallel rank ``tp_rank`` of ``tp``."""
    shape = list(spec.shape)
    if spec.tp_dim is not None and tp > 1:
        shape[spec.tp_dim] = chunk_rows(shape[spec.tp_dim], tp, tp_rank)
    return tuple(shape)


def shard_elements(spec: ParamSpec, layout: ParallelLayout, tp_rank: int, shard_rank: int,
                   expert_rank: int = 0) -> tuple[int, int]:
    """(elements held, elements in FSDP's padded buffer) of ``spec`` on the rank at those coordinates
    (``expert_rank``: its index among the ranks holding the same experts)."""
    piece = tp_piece(spec, layout.tp, tp_rank)
    if not piece:  # a scalar is not split
        return 1, 1
    if spec.expert:  # one EP rank's experts (counted once per EP group), FSDP's rows of them
        piece = (piece[0] // layout.ep, *piece[1:])
        shards, shard_rank = layout.expert_shards, expert_rank
    else:
        shards = layout.dp_shard
    rows = piece[spec.fsdp_dim]
    rest = prod(piece[:spec.fsdp_dim] + piece[spec.fsdp_dim + 1:])
    held = chunk_rows(rows, shards, shard_rank) * rest
    return held, -(-rows // shards) * rest


def rank_state_bytes(specs: Iterable[ParamSpec], layout: ParallelLayout, tp_rank: int = 0, shard_rank: int = 0,
                     slots: int = ADAM_SLOTS, precision: Precision = FP32, expert_rank: int = 0) -> StateBytes:
    """What the rank at (``tp_rank``, ``shard_rank``, ``expert_rank``: :func:`shard_elements`) holds
    for a stage of ``specs`` (each parameter once, tied ones included once), with ``slots``
    optimizer tensors per parameter (AdamW: 2; SGD without momentum: 0, and then no step scalar).
    Coordinates 0 hold the most: ``torch.chunk`` gives the first pieces the most rows, for every
    parameter at once."""
    params = optimizer = gathered = reduced = 0
    for spec in specs:
        held, padded = shard_elements(spec, layout, tp_rank, shard_rank, expert_rank)
        params += padded * spec.element_bytes
        optimizer += slots * held * spec.element_bytes + (STEP_BYTES if slots else 0)
        piece = prod(tp_piece(spec, layout.tp, tp_rank))
        if spec.expert:  # this EP rank's experts, gathered only where FSDP shards them
            piece = piece // layout.ep if layout.expert_shards > 1 else 0
        gathered += piece * (precision.gathered or spec.element_bytes)
        reduced += piece * (precision.unsharded_grad or spec.element_bytes)
    return StateBytes(params, 0 if precision.zero1 else params, optimizer, gathered, reduced)


@dataclass(frozen=True)
class RankBytes:
    """One rank's bytes besides activations (see the module doc)."""

    params: int
    grads: int
    optimizer: int
    gathered: int = 0  # the gathered window's parameters, beyond the shards
    unsharded_grads: int = 0  # full-size gradients until REDUCE_GRAD, beyond the shards
    buffers: int = 0  # the largest unit's all-gather output and reduce-scatter input

    @property
    def sharded(self) -> int:
        """Parameters, gradients and optimizer state: what stays between steps."""
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return self.sharded + self.gathered + self.unsharded_grads + self.buffers

    def to_json(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def rank_bytes(stages: Sequence[StateBytes], dp_shard: int, largest_unit: StateBytes = NOTHING,
               window: Optional[int] = None, grads_held: Optional[int] = None, zero1: bool = False) -> RankBytes:
    """What a rank holds at its peak for its local ``stages`` (each :func:`rank_state_bytes`)
    under ``dp_shard`` shards; ``largest_unit``: its largest FSDP unit (a block).

    ``window``: how many stages are gathered at once (the largest ones count; default all);
    ``grads_held``: how many stages hold unsharded gradients at the peak (default all: every
    stage's first backward comes before the first ``REDUCE_GRAD`` under the schedules the
    advisor builds, and zero-bubble schedules defer their ``W`` further). Without shards
    nothing is gathered: the parameters are whole already. Under ``zero1`` (:class:`Precision`)
    the collectives run in place: no buffers."""
    total = sum(stages, NOTHING)
    if dp_shard == 1:
        return RankBytes(total.params, total.grads, total.optimizer)
    gathered = sorted((s.gathered_params for s in stages), reverse=True)
    reduced = sorted((s.unsharded_grads for s in stages), reverse=True)
    return RankBytes(total.params, total.grads, total.optimizer, sum(gathered[:window]), sum(reduced[:grads_held]),
                     0 if zero1 else largest_unit.gathered_params + largest_unit.unsharded_grads)


def tp_activation_shares(tp: int, sequence_parallel: bool = True) -> tuple[float, float]:
    """(share of a layer's stored activations, share of a stage's input) one of ``tp`` ranks
    holds: all split under sequence parallelism (torchtitan's plan); without it (Megatron-LM
    before 2022) only the ``24/34`` inside the attention and MLP blocks, and a stage's (or a
    recomputed layer's) input not at all (Korthikanti et al. 2022)."""
    if sequence_parallel:
        return 1 / tp, 1 / tp
    return OUTSIDE_BLOCKS_SHARE + (1 - OUTSIDE_BLOCKS_SHARE) / tp, 1.0


def largest_rank_state_bytes(specs: Iterable[ParamSpec], layout: ParallelLayout, slots: int = 2) -> StateBytes:
    """The rank that holds the most (steady bytes) among the layout's tp x dp_shard coordinates:
    the figure a memory limit is checked against."""
    specs = list(specs)
    every = (rank_state_bytes(specs, layout, t, s, slots) for t in range(layout.tp) for s in range(layout.dp_shard))
    return max(every, key=lambda b: (b.steady, b.gathered_params))


def empty_shards(specs: Iterable[ParamSpec], layout: ParallelLayout) -> list[tuple[int, int]]:
    """(tp rank, shard rank) coordinates that would hold no element of the stage's parameters."""
    specs = list(specs)
    return [(t, s) for t in range(layout.tp) for s in range(layout.dp_shard)
            if not any(shard_elements(spec, layout, t, s)[0] for spec in specs)]
