"""What a checkpoint calls each tensor: the unpipelined model's names (renamed, for a Hugging Face
model, to its own), a tied weight once, under its group's first name, on every placement."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn


def same_name(name: str) -> str:
    """The unpipelined model's name as the checkpoint's (no renaming)."""
    return name


def tied_view(module: nn.Module, tied: Sequence[Sequence[str]] = (),
              rename: Callable[[str], str] = same_name) -> nn.Module:
    """``module``'s parameters and persistent buffers (the live tensors, its names the unpipelined
    model's) as what a checkpoint holds: each under ``rename(name)``, a tied one once, under its
    group's first name. Saving and loading through it keys a tied weight and its optimizer state
    alike on every placement: one rank holding the group as one ``Parameter`` and ranks holding
    one copy each."""
    first = {name: group[0] for group in tied for name in group}
    view = nn.Module()
    for name, tensor in module.state_dict(keep_vars=True).items():
        _hold(view, rename(first.get(name, name)), tensor)
    return view


def _hold(view: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Register ``tensor`` (a parameter or buffer) under the dotted ``name`` of ``view`` (once)."""
    path, _, attr = name.rpartition(".")
    holder = view
    for part in path.split(".") if path else []:
        if not hasattr(holder, part):
            holder.add_module(part, nn.Module())
        holder = getattr(holder, part)
    if attr in holder._parameters or attr in holder._buffers:
        return
    if isinstance(tensor, nn.Parameter):
        holder.register_parameter(attr, tensor)
    else:
        holder.register_buffer(attr, tensor)


def model_shapes(build_block: Callable[[int], nn.Module], num_blocks: int, tied: Sequence[Sequence[str]] = (),
                 rename: Callable[[str], str] = same_name) -> dict[str, torch.Size]:
    """Every entry a checkpoint of the unpipelined model holds (:func:`tied_view`'s names) and its
    shape, without allocating it."""
    from ..stages.partition import meta_block

    others = {name for group in tied for name in group[1:]}
    return {
        rename(f"{i}.{name}"): t.shape for i in range(num_blocks)
        for name, t in meta_block(build_block, i).state_dict().items() if f"{i}.{name}" not in others
    }
