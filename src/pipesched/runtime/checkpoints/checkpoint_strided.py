"""Interleaved tensor-parallel pieces in a checkpoint: written whole along ``tp``, put back after.

A Linear fusing equal projections (Phi-3's q|k|v and gate|up) is split by
:class:`~pipesched.runtime.sharding.tp_styles.FusedColwise`: each ``tp`` rank holds the same slice
of every projection (``_StridedShard``), rows that are not one block of the whole tensor. DCP
records each piece by one offset per dim, so it cannot place such a piece (its planner refuses the
save: "overlapping chunks"). Before a save, and as the template of a load, every such DTensor
(its optimizer state too) is gathered along the ``tp`` mesh dim (``Replicate``): what is left is
split the way DCP describes (FSDP's block of input features), and the saved entry is the whole
tensor in transformers' layout, which any layout reads back. After a load each is redistributed
to its live placements (a local slice) before it is copied into the parameter or the optimizer.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.placement_types import _StridedShard


def _interleaved(t: Any) -> bool:
    return isinstance(t, DTensor) and any(isinstance(p, _StridedShard) for p in t.placements)


def portable(state: Any) -> Any:
    """``state`` (nested dicts of tensors) with each interleaved DTensor gathered along its
    interleaved mesh dims; every other value is the same object."""
    if isinstance(state, dict):
        return {k: portable(v) for k, v in state.items()}
    if _interleaved(state):
        return state.redistribute(placements=[Replicate() if isinstance(p, _StridedShard) else p for p in state.placements])
    return state


def restored(loaded: Any, live: Any) -> Any:
    """``loaded`` (what DCP filled into :func:`portable`'s template) with each interleaved entry
    placed as its ``live`` counterpart again."""
    if isinstance(loaded, dict):
        return {k: restored(v, live[k]) for k, v in loaded.items()}
    if _interleaved(live):
        return loaded.redistribute(placements=live.placements)
    return loaded
