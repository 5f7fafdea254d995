"""A model description's costs and bytes on one rank of a whole layout (pp x replicas x shards x tp).

:class:`LayoutCosts` is the advisor's :class:`~pipesched.advise.estimate.TransformerCosts` for
one pipeline of a :class:`~pipesched.parallel_layout.ParallelLayout`:

- **compute** is split ``tp`` ways (every layer's matrices, the head and the embedding);
- **tensor parallelism's collectives sit on the compute lane**: per layer, the forward runs two
  all-reduces of the layer's activation ``s x b x h`` (Megatron's ``g`` operators; with sequence
  parallelism a reduce-scatter and an all-gather each, the same ring volume) and the backward
  two more, on the ``tp`` dimension's link (:mod:`.fabric`); a recomputed forward repeats its own;
- **pipeline sends** are each ``tp`` rank's own share of the boundary activation, ``1/tp`` of it,
  on that rank's link of the ``pp`` dimension (every GPU has its own NVLink port and network
  card): under sequence parallelism each rank holds only its ``s/tp`` tokens between layers
  (torchtitan's plan sends them as they are); without it every rank holds the whole activation,
  and Megatron-LM's scatter-gather (Narayanan et al. 2021, section 4.1) sends one ``1/tp`` slice
  per rank and all-gathers the slices over the ``tp`` link on arrival, a ring all-gather priced
  in :mod:`.fabric` (:meth:`LayoutCosts.comm_ms`);
- **expert parallelism** (``ep``, a model with experts: :mod:`.transformer_experts`): every
  layer's forward runs a dispatch and a combine all-to-all of its tokens' copies for their
  routed experts, the backward two more, on the compute lane over the EP group's link
  (:meth:`~.fabric.Fabric.expert_link`); a rank holds ``1/ep`` of the routed experts. DualPipe's
  overlapped pairs hide each half's all-to-alls behind the other half's compute
  (:meth:`LayoutCosts.costs` sets ``Costs.overlap`` so that a pair takes its two computes plus
  whatever all-to-all outlasts the other half's compute);
- **activations** are split ``tp`` ways under sequence parallelism (torchtitan's plan); without
  it only the part inside the attention and MLP blocks is
  (:func:`~pipesched.sharded_bytes.tp_activation_shares`);
- **weights, gradients, optimizer state, the gathered window and the unsharded gradients** are
  :mod:`pipesched.sharded_bytes`'s rules applied to the transformer's shapes
  (:func:`~.transformer_bytes.transformer_rank_bytes`), for Adam (``optimizer_slots``) under
  ``precision`` (FSDP's mixed precision), the vocabulary split by TP where ``vocab_parallel``.

With ``tp == dp_shard == 1`` every figure equals :class:`TransformerCosts`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from ..memory import MemorySizes, StageMemory
from ..parallel_layout import ParallelLayout
from ..sharded_bytes import ADAM_SLOTS, MIXED, Precision, RankBytes, tp_activation_shares
from .estimate import TransformerCosts
from ..costs import Costs
from ..errors import ConfigError
from .fabric import Fabric, Link, all_gather_time, all_reduce_time, all_to_all_time
from .transformer import TransformerSpec
from .transformer_bytes import stage_bytes, transformer_rank_bytes

def check_ep(spec: TransformerSpec, ep: int) -> None:
    """Refuse (one line) expert parallelism on a dense model, or one not dividing the experts."""
    if ep > 1 and spec.experts is None:
        raise ConfigError(f"--ep {ep} needs a model with experts (--experts)")
    if spec.experts is not None and spec.experts.routed % ep:
        raise ConfigError(f"--ep {ep} does not divide the {spec.experts.routed} experts")


TP_COLLECTIVES_PER_PASS = 2  # all-reduces (or reduce-scatter + all-gather pairs) per layer, each of F and B
ALL_TO_ALLS_PER_PASS = 2  # EP's dispatch and combine per layer, each of F and B


@dataclass(frozen=True)
class LayoutCosts(TransformerCosts):
    """One pipeline of ``layout`` (``ranks`` is ``layout.pp``); see the module doc."""

    layout: ParallelLayout = field(default_factory=lambda: ParallelLayout(1))
    tp_link: Link = Link(1.0)  # unused at tp 1 (a one-rank collective costs nothing)
    pp_link: Link = Link(1.0)  # the pipeline sends' link, per GPU
    ep: int = 1  # expert parallelism: ranks of a stage's data-parallel ones that split the routed experts
    ep_link: Link = Link(1.0)  # unused at ep 1
    precision: Precision = MIXED
    sequence_parallel: bool = True
    vocab_parallel: bool = True  # TP splits the embedding and head by vocabulary (pipesched's runtime: False)
    optimizer_slots: int = ADAM_SLOTS  # state tensors per parameter (SGD without momentum: 0)

    @classmethod
    def for_layout(cls, base: TransformerCosts, layout: ParallelLayout, fabric: Fabric,
                   precision: Precision = MIXED, sequence_parallel: bool = True, **options) -> "LayoutCosts":
        """``base``'s model and GPU on one pipeline of ``layout``: pipeline sends on the ``pp``
        dimension's link, TP's collectives on the ``tp`` dimension's."""
        pp_link = fabric.link(layout, "pp")
        hardware = replace(base.hardware, bandwidth=pp_link.bandwidth * 1e3 / 1e9)
        fields = {name: getattr(base, name) for name in TransformerCosts.__dataclass_fields__}
        fields.update(ranks=layout.pp, hardware=hardware)
        ep = options.get("ep", 1)
        check_ep(base.spec, ep)
        if layout.dp % ep:
            raise ConfigError(f"--ep {ep} does not divide the {layout.dp} data-parallel ranks of {layout}")
        return cls(**fields, layout=layout, tp_link=fabric.link(layout, "tp"), pp_link=pp_link, precision=precision,
                   sequence_parallel=sequence_parallel, ep_link=fabric.expert_link(layout, ep), **options)

    @property
    def tp(self) -> int:
        return self.layout.tp

    def _ms(self, flops: float) -> float:
        return super()._ms(flops) / self.tp

    def tp_collective_ms(self, scale: float = 1.0) -> float:
        """One of TP's per-layer all-reduces of a microbatch's activation, ms."""
        return all_reduce_time(self.tp, self.spec.p2p_bytes(self.spec.microbatch_size * scale), self.tp_link)

    def comm_ms(self, scale: float = 1.0) -> float:
        """One stage boundary's send, ms: each ``tp`` rank's ``1/tp`` of the activation on its own
        ``pp`` link (bandwidth-bound, as :class:`TransformerCosts` prices a send), then, without
        sequence parallelism, the slices' all-gather over the ``tp`` link (Megatron-LM's
        scatter-gather; see the module doc)."""
        whole = self.spec.p2p_bytes(self.spec.microbatch_size * scale)
        send = whole / self.tp / self.pp_link.bandwidth
        return send if self.sequence_parallel else send + all_gather_time(self.tp, whole, self.tp_link)

    def all_to_all_ms(self, scale: float = 1.0) -> float:
        """One of EP's per-layer all-to-alls of a microbatch, ms (0 at ep 1: every expert local)."""
        experts = self.spec.experts
        if experts is None or self.ep == 1:
            return 0.0
        tokens = self.spec.seq_len * self.spec.microbatch_size * scale / (self.tp if self.sequence_parallel else 1)
        return all_to_all_time(self.ep, experts.dispatch_bytes(tokens, self.spec.hidden, self.spec.dtype_bytes),
                               self.ep_link)

    def layer_times(self, scale: float = 1.0, experts: bool = True) -> tuple[float, float, float]:
        """F, B, W of one layer with TP's collectives and, in a layer with experts, EP's all-to-alls."""
        f, b, w = super().layer_times(scale, experts)
        comm = TP_COLLECTIVES_PER_PASS * self.tp_collective_ms(scale) + ALL_TO_ALLS_PER_PASS * self.all_to_all_ms(scale) * experts
        return f + comm, b + comm, w

    def costs(self, stages: int, placement: str, scale: float) -> Costs:
        """:class:`TransformerCosts`'s, with an overlapped pair's price (``overlap``) hiding each
        half's all-to-alls behind the other half's compute, where EP sends any."""
        c = super().costs(stages, placement, scale)
        moe = self.spec.layers - self.spec.dense_layers
        sent = moe / self.ranks * ALL_TO_ALLS_PER_PASS * self.all_to_all_ms(scale)  # per rank and pass
        if sent == 0:
            return c
        forward, backward = c.F, c.B + c.W  # an overlapped pair's backward is a full one
        both = (forward - sent) + (backward - sent)  # the two halves' compute
        paired = both + max(0.0, sent - (backward - sent)) + max(0.0, sent - (forward - sent))
        overlap = (paired - max(forward, backward)) / min(forward, backward)
        return replace(c, overlap=min(1.0, max(0.0, overlap)))

    def stage_sizes(self, stages: int, placement: str, scale: float) -> MemorySizes:
        sizes = super().stage_sizes(stages, placement, scale)
        k, i = tp_activation_shares(self.tp, self.sequence_parallel)
        return replace(sizes, stages=tuple(StageMemory(s.keep * k, s.stash * k) for s in sizes.stages),
                       inputs=tuple(x * i for x in sizes.inputs))

    def _activation_bytes(self, rank: dict, scale: float) -> float:
        return super()._activation_bytes(rank, scale) * tp_activation_shares(self.tp, self.sequence_parallel)[0]

    def activation_budgets(self, stages: int, placement: str) -> Optional[tuple[float, ...]]:
        """Activation bytes each rank may hold, less its state; with FSDP under pipelining less its
        state but the unsharded gradients, which a priced row places on the simulated timeline
        (:mod:`.layout_rows`, :mod:`.held_gradients`): a necessary condition here, the row's peak
        the verdict. (The M_B limit a family is steered to keeps counting them whole.)"""
        budget = self.budget_bytes()
        if budget is None:
            return None
        placed = self.grads_on_timeline
        return tuple(budget - (b.total - placed * b.unsharded_grads) for b in self.ranks_bytes(stages, placement))

    @property
    def grads_on_timeline(self) -> bool:
        """Whether a rank's unsharded gradients are held only from a stage's first weight-gradient
        pass to its reduction (FSDP under pipelining), not the whole step (no FSDP, or ZeRO-1's
        gradient buffer, allocated once: :class:`~pipesched.sharded_bytes.Precision`)."""
        return self.layout.pp > 1 and self.layout.dp_shard > 1 and not self.precision.zero1

    def rank_bytes(self, rank: dict, tp_rank: int = 0, shard_rank: int = 0) -> RankBytes:
        """Weights, gradients, optimizer state, gathered window and buffers of one rank
        (``rank`` as :meth:`_ranks_of` describes it; the coordinates default to the fullest)."""
        return transformer_rank_bytes(self.spec, self.layout, rank["layers"], rank["first"], rank["last"],
                                      self.optimizer_slots, self.precision, self.vocab_parallel, tp_rank, shard_rank,
                                      self.ep)

    def gathered_bytes_per_stage(self, stages: int, placement: str) -> list[float]:
        """Bytes each stage all-gathers (its parameters in the gathered dtype, after TP's split)."""
        return [b.gathered_params for b in self._stage_bytes(stages, placement)]

    def reduced_bytes_per_stage(self, stages: int, placement: str) -> list[float]:
        """Bytes each stage's gradients reduce (unsharded, in the reduce dtype, after TP's split)."""
        return [b.unsharded_grads for b in self._stage_bytes(stages, placement)]

    def _stage_bytes(self, stages: int, placement: str) -> list:
        return stage_bytes(self.spec, self.layout, self.layers_per_stage(stages, placement), self.optimizer_slots,
                           self.precision, self.vocab_parallel, self.ep)
