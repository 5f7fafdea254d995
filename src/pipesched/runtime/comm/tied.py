"""Parameters tied across stages (an embedding and a head that are one weight), as a rank holds them.

The caller names each tied group by the parameters' unpipelined names (``("0.wte.weight",
"5.head.weight")``). On a rank holding several of a group's names (a V placement puts the first
and last stage on rank 0) they become one ``Parameter``: the first held name's, set on the other
modules, so autograd sums both holders' gradients into it and the optimizer, the gradient norm
and the weight guard see it once. Across ranks the copies start from the value of the group's
first name (broadcast from its lowest holder, at start and after loading a checkpoint), their
gradients are summed by the reduction plan (:mod:`~pipesched.runtime.comm.reduction`), and every copy
takes the same optimizer step, so they stay bitwise equal.

Sharded stages cannot share one ``Parameter`` between two stages of a rank: FSDP2 makes each
stage's parameters its own groups' (a parameter in two stages' groups would be gathered, freed and
reduced by one of them only). There (``per_stage``) each stage holds its own copy, starting from
the first's value, laid out alike (both sharded over the same mesh, neither split by tensor
parallelism, or both alike). Only the first copy is the optimizer's; :mod:`.tied_copies` keeps
the others equal to it.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn

from ...errors import ConfigError
from .reduction import ReductionPlan, block_of
from .tied_copies import follow


def locate(stages: dict[int, nn.Module], name: str) -> list[tuple[int, nn.Module, str]]:
    """(stage, module, attribute) of every place on this rank that holds parameter ``name``."""
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
            places.append((s, module, attr))
    return places


@torch.no_grad()
def share_on_rank(stages: dict[int, nn.Module], tied: Sequence[Sequence[str]], per_stage: bool = False) -> None:
    """Make each tied group one ``Parameter`` on this rank, or with ``per_stage`` one per stage
    holding it, each the first's value (see module doc)."""
    for names in tied:
        for name in names:
            block_of(name)
        places = [place for name in names for place in locate(stages, name)]
        if not places:
            continue
        first_stage, *place = places[0]
        param = getattr(*place)
        own = {first_stage: param}
        for s, module, attr in places[1:]:
            other = getattr(module, attr)
            if other.shape != param.shape or other.dtype != param.dtype:
                raise ConfigError(
                    f"tied parameters {list(names)} differ: {tuple(param.shape)} {param.dtype} against "
                    f"{tuple(other.shape)} {other.dtype}"
                )
            if s not in own:  # a copy of its own even where the blocks were built sharing one (a Hugging Face model's)
                own[s] = nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad) if per_stage else param
            setattr(module, attr, own[s])


def held(stages: dict[int, nn.Module], tied: Sequence[Sequence[str]]) -> dict[int, list[nn.Parameter]]:
    """The ``Parameter`` copies of each tied group this rank holds (one, or one per stage after
    :func:`share_on_rank` ``per_stage``), the first's first, as the stages hold them now (after
    sharding replaced the parameters)."""
    out = {}
    for g, names in enumerate(tied):
        copies = {id(p): p for p in (getattr(module, attr) for name in names for _, module, attr in locate(stages, name))}
        if copies:
            out[g] = list(copies.values())
    return out


@torch.no_grad()
def broadcast(plan: ReductionPlan, shared: dict[int, list[nn.Parameter]]) -> None:
    """Give every copy of each tied group the value of the group's first name (collective over
    each group's holders, every replica included; each group in order), on this rank too."""
    for g in sorted(plan.tied_layouts):
        target = plan.broadcast_group(g)
        if target is None:
            continue
        group, src = target
        param = shared[g][0]
        on_host = dist.get_backend(group) == "gloo" and param.device.type != "cpu"
        data = param.detach().cpu() if on_host else getattr(param.data, "_local_tensor", param.data)  # a shard's piece
        dist.broadcast(data, src=src, group=group)
        if on_host:
            param.copy_(data)
    follow(shared)
