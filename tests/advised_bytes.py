"""The advisor's bytes per rank for a run of the built-in gpt: what tests/test_sharded_pipelines.py
and tests/test_sharded_cli.py hold the runtime's measured bytes against.

The advisor describes the gpt by its sizes (:class:`~pipesched.advise.transformer.TransformerSpec`
with ``ends="gpt"``: learned positions, a final LayerNorm and a head with a bias) and prices a rank
with :meth:`~pipesched.advise.layout_costs.LayoutCosts.rank_bytes`, the function its layout search
holds every rank to; the rank's blocks are the run's (its stages' block counts and placement),
its precision the run's (fp32, no mixed-precision policy) and the vocabulary kept whole on every
``tp`` rank, as the runtime's plan keeps it (runtime/sharding/tp_plans.py).
"""

from __future__ import annotations

import inspect
from typing import Sequence

from pipesched.advise.layout_costs import LayoutCosts
from pipesched.advise.transformer import TransformerSpec
from pipesched.parallel_layout import ParallelLayout
from pipesched.sharded_bytes import FP32

STATES = ("params", "grads", "optimizer")


def gpt_spec(layers: int, dim: int, heads: int, context: int) -> TransformerSpec:
    """The gpt of these sizes as the advisor describes a transformer."""
    from pipesched.training.datasets import text_vocabulary

    return TransformerSpec(layers, dim, context, 1, heads=heads, vocab=len(text_vocabulary()), ends="gpt")


def gpt_defaults() -> dict:
    """``pipesched train --model gpt``'s sizes (gpt_model's defaults)."""
    from pipesched.training.models import gpt_model

    return {name: p.default for name, p in inspect.signature(gpt_model).parameters.items()}


def advised_state_bytes(size: dict, layout: ParallelLayout, placement: Sequence[int], counts: Sequence[int],
                        rank: int, slots: int) -> dict[str, int]:
    """Parameters, gradients and optimizer state the advisor predicts for global ``rank`` of a
    gpt run whose stages hold ``counts`` blocks (embedding, layers, head) placed by ``placement``."""
    spec = gpt_spec(**size)
    where = layout.coordinates(rank)
    starts = [sum(counts[:s]) for s in range(len(counts))]
    blocks = [b for s, start in enumerate(starts) if placement[s] == where["pp"] for b in range(start, start + counts[s])]
    held = {"layers": sum(1 <= b <= spec.layers for b in blocks), "first": 0 in blocks, "last": spec.layers + 1 in blocks}
    costs = LayoutCosts(spec, layout.pp, layout=layout, precision=FP32, vocab_parallel=False, optimizer_slots=slots)
    predicted = costs.rank_bytes(held, where["tp"], where["dp_shard"])
    return {what: getattr(predicted, what) for what in STATES}

