"""A model description's costs and bytes on one rank of a whole layout (pp x replicas x shards x tp).

:class:`LayoutCosts` is the advisor's :class:`~pipesched.advise.estimate.TransformerCosts` for
one pipeline of a :class:`~pipesched.parallel_layout.ParallelLayout`:

- **compute** is split ``tp`` ways (every layer's matrices, the head and the embedding);
- **tensor parallelism's collectives sit on the compute lane**: per layer, the forward runs two
  all-reduces of the layer's activation ``s x b x h`` (Megatron's ``g`` operators; with sequence
  parallelism a reduce-scatter and an all-gather each, the same ring volume) and the backward
  two more, on the ``tp`` dimension's link (:mod:`.fabric`); a recomputed forward repeats its own;
- **activations** are split ``tp`` ways under sequence parallelism (torchtitan's plan); without
  it (Megatron-LM before 2022) only the ``24/34`` of a layer's stored activations inside the
  attention and MLP blocks are, and a recomputed layer's input is not (Korthikanti et al. 2022);
- **weights, gradients and optimizer state** follow :func:`~.sharded_memory.rank_state_bytes`:
  sharded ``dp_shard x tp`` ways, plus the gathered window and the unsharded gradients under FSDP.
  With a pipeline (pp > 1) every local stage stays gathered from its first forward to its last
  backward (torchtitan's ``reshard_after_forward=False`` under PP); without one FSDP reshards each
  block after its forward and reduce-scatters after its backward, so two blocks are gathered and
  two blocks' gradients unsharded at a time.

With ``tp == dp_shard == 1`` every figure equals :class:`TransformerCosts`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..memory import MemorySizes, StageMemory
from ..parallel_layout import ParallelLayout
from .estimate import TransformerCosts
from .fabric import Fabric, Link, all_reduce_time
from .sharded_memory import (
    MIXED, Precision, RankBytes, layer_shapes, local_numel, rank_state_bytes, transformer_stage_shapes,
)

TP_COLLECTIVES_PER_PASS = 2  # all-reduces (or reduce-scatter + all-gather pairs) per layer, each of F and B
OUTSIDE_BLOCKS_SHARE = 10 / 34  # of Korthikanti's 34sbh per layer: norms, residuals, dropout inputs (not split without SP)
FSDP_BLOCKS_WITHOUT_PP = 2  # blocks gathered (and gradients unsharded) at once when FSDP reshards after forward


@dataclass(frozen=True)
class LayoutCosts(TransformerCosts):
    """One pipeline of ``layout`` (``ranks`` is ``layout.pp``); see the module doc."""

    layout: ParallelLayout = field(default_factory=lambda: ParallelLayout(1))
    tp_link: Link = Link(1.0)  # unused at tp 1 (a one-rank collective costs nothing)
    precision: Precision = MIXED
    sequence_parallel: bool = True

    @classmethod
    def for_layout(cls, base: TransformerCosts, layout: ParallelLayout, fabric: Fabric,
                   precision: Precision = MIXED, sequence_parallel: bool = True) -> "LayoutCosts":
        """``base``'s model and GPU on one pipeline of ``layout``: pipeline sends on the ``pp``
        dimension's link, TP's collectives on the ``tp`` dimension's."""
        pp_link = fabric.link(layout, "pp")
        hardware = replace(base.hardware, bandwidth=pp_link.bandwidth * 1e3 / 1e9)
        fields = {name: getattr(base, name) for name in TransformerCosts.__dataclass_fields__}
        fields.update(ranks=layout.pp, hardware=hardware)
        return cls(**fields, layout=layout, tp_link=fabric.link(layout, "tp"), precision=precision,
                   sequence_parallel=sequence_parallel)

    @property
    def tp(self) -> int:
        return self.layout.tp

    def _ms(self, flops: float) -> float:
        return super()._ms(flops) / self.tp

    def tp_collective_ms(self, scale: float = 1.0) -> float:
        """One of TP's per-layer all-reduces of a microbatch's activation, ms."""
        return all_reduce_time(self.tp, self.spec.p2p_bytes(self.spec.microbatch_size * scale), self.tp_link)

    def layer_times(self, scale: float = 1.0) -> tuple[float, float, float]:
        f, b, w = super().layer_times(scale)
        comm = TP_COLLECTIVES_PER_PASS * self.tp_collective_ms(scale)
        return f + comm, b + comm, w

    def _keep_share(self) -> float:
        if self.sequence_parallel:
            return 1 / self.tp
        return OUTSIDE_BLOCKS_SHARE + (1 - OUTSIDE_BLOCKS_SHARE) / self.tp

    def _input_share(self) -> float:
        return 1 / self.tp if self.sequence_parallel else 1.0

    def stage_sizes(self, stages: int, placement: str, scale: float) -> MemorySizes:
        sizes = super().stage_sizes(stages, placement, scale)
        k, i = self._keep_share(), self._input_share()
        return replace(sizes, stages=tuple(StageMemory(s.keep * k, s.stash * k) for s in sizes.stages),
                       inputs=tuple(x * i for x in sizes.inputs))

    def _activation_bytes(self, rank: dict, scale: float) -> float:
        return super()._activation_bytes(rank, scale) * self._keep_share()

    def rank_bytes(self, rank: dict) -> RankBytes:
        """Weights, gradients, optimizer state, gathered window and buffers of one rank
        (``rank`` as :meth:`_ranks_of` describes it)."""
        spec = self.spec
        shapes = transformer_stage_shapes(spec.hidden, None, [rank["layers"]])[0]
        ends = [(spec.vocab * spec.hidden, True)] * (rank["first"] + rank["last"]) if spec.vocab else []
        if self.ranks == 1 and self.layout.dp_shard > 1:  # FSDP alone: each block its own unit
            units = [layer_shapes(spec.hidden)] * rank["layers"] + [[e] for e in ends]
            return rank_state_bytes(units, self.layout.dp_shard, self.tp, self.precision,
                                    window=FSDP_BLOCKS_WITHOUT_PP, grads_held=FSDP_BLOCKS_WITHOUT_PP)
        return rank_state_bytes([shapes + ends], self.layout.dp_shard, self.tp, self.precision)

    def _state_bytes(self, rank: dict) -> float:
        return self.rank_bytes(rank).total

    def gathered_bytes_per_stage(self, stages: int, placement: str) -> list[float]:
        """Bytes each stage all-gathers (its parameters in the gathered dtype, after TP's split)."""
        return self._per_stage(stages, placement, self.precision.gathered)

    def reduced_bytes_per_stage(self, stages: int, placement: str) -> list[float]:
        """Bytes each stage's gradients reduce (unsharded, in the reduce dtype, after TP's split)."""
        return self._per_stage(stages, placement, self.precision.unsharded_grad)

    def _per_stage(self, stages: int, placement: str, width: int) -> list[float]:
        shapes = transformer_stage_shapes(self.spec.hidden, self.spec.vocab, self.layers_per_stage(stages, placement))
        return [width * local_numel(s, self.tp) for s in shapes]
