"""Entries each rank holds a block of rows of, as plain tensors (expert parallelism's experts):
saved and loaded as the whole tensor's ``Shard(0)`` DTensor over the ranks that hold its blocks.

Under ``ep`` a rank holds experts ``first .. first + rows - 1`` of each MoE layer's stacked
``gate_up_proj`` / ``down_proj`` (and their AdamW moments) as an ordinary tensor of ``rows``
experts. Saved under the layer's name as it is, each rank's piece would claim to be the whole
tensor. Wrapped as a DTensor ``Shard(0)`` of the whole ``[experts, ...]`` over the EP group, DCP
records each piece's offset in the whole tensor (the experts' global indices), and the entry is
the one a run at ``ep 1`` (or one process) writes: same name, same shape. Loading asks each
rank's DTensor for its rows, so DCP reshards for free between any EP degrees, other pipeline or
data-parallel layouts included. (The alternative, one entry per expert, would name entries that
no ``ep 1`` run or one process writes, and need restacking on every load.) Ranks holding the
same experts in other EP groups write the same chunk; DCP keeps one (its save plan deduplicates).
Where FSDP shards each rank's experts (a DTensor over the ranks holding the same ones), the
rank's block is its shard's rows: the whole tensor is then ``[Shard(0), Shard(0)]`` over a 2-D
mesh (EP, then those shards, :func:`pipesched.runtime.comm.expert_mesh.pieces_mesh`), and a load
gives back FSDP's DTensor (``held``), its storage the one DCP filled.

Which entries are pieces, and where each rank's rows sit, comes from one function of the
runtime's (:data:`Slicer`, :func:`pipesched.runtime.sharding.expert_parallel.expert_slice`); this
module only tells DCP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

Slicer = Callable[[torch.Tensor], tuple[torch.Tensor, int, int]]  # tensor -> (its rows, first row, rows of the whole)


@dataclass(frozen=True)
class Pieces:
    """The model entries (checkpoint names) held in row blocks, how to find a tensor's block
    (``slicer``), and the ranks whose blocks make each whole tensor (``mesh``: 1-D, or 2-D where
    each rank's block is itself split, ``[Shard(0), Shard(0)]`` nesting the splits); ``held``:
    FSDP's mesh and placements of the blocks where FSDP shards them (None: plain tensors)."""

    names: frozenset
    slicer: Slicer
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh
    held: Optional[tuple] = None  # (DeviceMesh, placements) of the live DTensors

    def whole(self, tensor: torch.Tensor) -> DTensor:
        """``tensor`` (this rank's block) as the whole tensor's ``Shard(0)`` DTensor, sharing its storage."""
        local, first, rows = self.slicer(tensor)
        shape = (rows, *local.shape[1:])
        placements = [Shard(0)] * self.mesh.ndim
        size, offset = compute_local_shape_and_global_offset(shape, self.mesh, placements)
        if size[0] != local.shape[0] or (size[0] and offset[0] != first):
            raise ValueError(f"rows {first}..{first + local.shape[0] - 1} of {rows} are not this rank's "
                             f"block of {placements} over {self.mesh}")
        return DTensor.from_local(local, self.mesh, placements, run_check=False, shape=shape,
                                  stride=torch.empty(shape, device="meta").stride())

    def block(self, whole: DTensor) -> torch.Tensor:
        """:meth:`whole`'s inverse: this rank's block of ``whole``, as the live tensor holds it."""
        local = whole.to_local()
        if self.held is None:
            return local
        shape = (whole.shape[0] // self.mesh.size(0), *whole.shape[1:])
        return DTensor.from_local(local, *self.held, run_check=False, shape=shape,
                                  stride=torch.empty(shape, device="meta").stride())


def _optim_name(key: str) -> str:
    """The parameter a flattened optimizer entry belongs to (``state.<name>.<slot>``)."""
    return key[len("state."):].rsplit(".", 1)[0] if key.startswith("state.") else ""


def as_whole(state: dict, pieces: Optional[Pieces]) -> dict:
    """``state`` (:func:`.checkpoint.training_state`) with each piece's model entry and its optimizer
    slots of the same shape (AdamW's moments; not its scalar step) as whole-tensor DTensors;
    ``pieces`` None: ``state`` itself."""
    if pieces is None:
        return state
    model = {k: pieces.whole(v) if k in pieces.names else v for k, v in state["model"].items()}
    optim = {k: pieces.whole(v) if _optim_name(k) in pieces.names and v.shape == state["model"][_optim_name(k)].shape
             else v for k, v in state["optim"].items()}
    return {**state, "model": model, "optim": optim}


def as_local(state: dict, pieces: Optional[Pieces]) -> dict:
    """``state`` loaded through :func:`as_whole`'s template with each piece this rank's block again."""
    if pieces is None:
        return state
    model = {k: pieces.block(v) if k in pieces.names else v for k, v in state["model"].items()}
    optim = {k: pieces.block(v) if isinstance(v, DTensor) and _optim_name(k) in pieces.names else v
             for k, v in state["optim"].items()}
    return {**state, "model": model, "optim": optim}
