"""Parameters tied across stages (an embedding and a head that are one weight), as a rank holds them.

The caller names each tied group by the parameters' unpipelined names (``("0.wte.weight",
"5.head.weight")``). On a rank holding several of a group's names (a V placement puts the first
and last stage on rank 0) they become one ``Parameter``: the first held name's, set on the other
modules, so autograd sums both holders' gradients into it and the optimizer, the gradient norm
and the weight guard see it once. Across ranks the copies start from the value of the group's
first name (broadcast from its lowest holder, at start and after loading a checkpoint), their
gradients are summed by the reduction plan (:mod:`~pipesched.runtime.comm.reduction`), and every copy
takes the same optimizer step, so they stay bitwise equal.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn

from ...errors import ConfigError
from .reduction import ReductionPlan, block_of


def _locate(stages: dict[int, nn.Module], name: str) -> list[tuple[nn.Module, str]]:
    """(module, attribute) of every place on this rank that holds parameter ``name``."""
    return [place for _, place in locate_by_stage(stages, name)]


def locate_by_stage(stages: dict[int, nn.Module], name: str) -> list[tuple[int, tuple[nn.Module, str]]]:
    """(stage, (module, attribute)) of every place on this rank that holds parameter ``name``."""
    block, _, rest = name.partition(".")
    module_path, _, attr = rest.rpartition(".")
    places = []
    for s, stage in stages.items():
        if block in stage.blocks:
            owner = stage.blocks[block]
            try:
                module = owner.get_submodule(module_path) if module_path else owner
            except AttributeError:
                module = None
            if module is None or not isinstance(module._parameters.get(attr), nn.Parameter):
                raise ConfigError(f"tied parameter {name!r} is not a parameter of block {block}")
            places.append((s, (module, attr)))
    return places


def share_on_rank(stages: dict[int, nn.Module], tied: Sequence[Sequence[str]]) -> dict[int, nn.Parameter]:
    """Make each tied group one ``Parameter`` on this rank; returns it per group this rank holds."""
    shared = {}
    for g, names in enumerate(tied):
        for name in names:
            block_of(name)
        places = [place for name in names for place in _locate(stages, name)]
        if not places:
            continue
        param = getattr(*places[0])
        for module, attr in places[1:]:
            other = getattr(module, attr)
            if other.shape != param.shape or other.dtype != param.dtype:
                raise ConfigError(
                    f"tied parameters {list(names)} differ: {tuple(param.shape)} {param.dtype} against "
                    f"{tuple(other.shape)} {other.dtype}"
                )
            setattr(module, attr, param)
        shared[g] = param
    return shared


def held(stages: dict[int, nn.Module], tied: Sequence[Sequence[str]]) -> dict[int, nn.Parameter]:
    """The one ``Parameter`` of each tied group this rank holds, as the stages hold it now (after
    :func:`share_on_rank`, and after sharding replaced the parameters)."""
    out = {}
    for g, names in enumerate(tied):
        places = [place for name in names for place in _locate(stages, name)]
        if places:
            out[g] = getattr(*places[0])
    return out


@torch.no_grad()
def broadcast(plan: ReductionPlan, shared: dict[int, nn.Parameter]) -> None:
    """Give every copy of each tied group the value of the group's first name (collective over
    each group's holders, every replica included; each group in order)."""
    for g in sorted(plan.tied_layouts):
        target = plan.broadcast_group(g)
        if target is None:
            continue
        group, src = target
        param = shared[g]
        on_host = dist.get_backend(group) == "gloo" and param.device.type != "cpu"
        data = param.detach().cpu() if on_host else getattr(param.data, "_local_tensor", param.data)  # a shard's piece
        dist.broadcast(data, src=src, group=group)
        if on_host:
            param.copy_(data)
