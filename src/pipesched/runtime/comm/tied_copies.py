"""The copies of a tied weight that sharded stages of one rank hold, one per stage (:mod:`.tied`).

Only the first copy is the optimizer's. The others' reduced gradients are added into it
(:func:`add_copies`, at the group's last ``REDUCE_GRAD`` on this rank, before any all-reduce with
other holders), given back the sum for what reads gradients by name (:func:`give_copies`), and
take its value after every step and every load (:func:`follow`). So the weight trains as one:
the same sum of gradients an unsharded rank's one ``Parameter`` collects, one optimizer step.
Memory holds it twice (parameter and gradient), its optimizer state once.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ...errors import ConfigError


def _local(t: torch.Tensor) -> torch.Tensor:
    return getattr(t, "_local_tensor", t)  # a shard's piece


def check_alike(copies: Sequence[nn.Parameter], names: Sequence[str]) -> None:
    """Refuse copies of a tied weight that sharding laid out differently (their pieces could not be added)."""
    first = copies[0]
    for other in copies[1:]:
        if getattr(other, "placements", None) != getattr(first, "placements", None) or _local(other).shape != _local(first).shape:
            raise ConfigError(f"the tied parameters {list(names)} are split differently by the tensor-parallel plan: "
                              "leave both out of the plan, or place them on different ranks")


@torch.no_grad()
def add_copies(first: nn.Parameter, others: Sequence[nn.Parameter]) -> None:
    """Add the (reduced) gradients of a tied weight's other copies on this rank into the first's."""
    for p in others:
        if p.grad is not None:
            if first.grad is None:
                first.grad = p.grad.clone()
            else:
                _local(first.grad).add_(_local(p.grad))


@torch.no_grad()
def give_copies(first: nn.Parameter, others: Sequence[nn.Parameter]) -> None:
    """Give the other copies the first's (whole) gradient, in their own buffers where they have one."""
    for p in others:
        if first.grad is None:
            p.grad = None
        elif p.grad is None:
            p.grad = first.grad.clone()
        else:
            _local(p.grad).copy_(_local(first.grad))


@torch.no_grad()
def follow(shared: dict[int, list[nn.Parameter]]) -> None:
    """Every other copy of each group takes its first copy's value (after a step, after loading)."""
    for first, *others in shared.values():
        for p in others:
            _local(p).copy_(_local(first))


def follower_specs(stages: dict[int, nn.Module], shared: dict[int, list[nn.Parameter]], specs: dict[int, list]) -> list:
    """The ``specs`` entries (:func:`~pipesched.runtime.sharding.tp_plans.param_specs`, one per
    parameter of each stage, in order) of every copy but the first: what holds no optimizer state."""
    followers = {id(p) for copies in shared.values() for p in copies[1:]}
    return [spec for s, stage in stages.items() for p, spec in zip(stage.parameters(), specs[s]) if id(p) in followers]
