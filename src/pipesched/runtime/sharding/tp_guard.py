"""Tensor parallelism's guard against partial gradients: a plan that leaves a plain replicated
parameter between a column-wise projection and its row-wise partner is refused on the first step.

Between the two splits each ``tp`` rank holds only its heads (or MLP columns). A parameter there
that stays a plain tensor, the same on every ``tp`` rank (Qwen3's per-head ``q_norm`` under
Llama's plan), sees only this rank's share: its gradient is partial, differs from rank to rank,
and nothing sums it, so training is silently wrong. A parameter the plan leaves whole *and*
outside that region (embeddings, the norms between blocks, the head, GPT-2's whole attention)
computes its gradient from tensors that are the same on every ``tp`` rank: the batch, and what a
row-wise all-reduce returns (each element reduced once and copied: the same bits on every rank).
Its gradient is then the same on every ``tp`` rank, up to the order of sums in a nondeterministic
kernel (CUDA atomics). So the guard compares, once, after the first step's reductions and before
its optimizer step, the gradients of every parameter that is not split over ``tp`` (a plain
tensor or FSDP's DTensor over the data dimensions only; a DTensor on the ``tp`` mesh, e.g. a
``Replicate`` norm weight fed a sharded input, has its partial gradients summed by DTensor)
across the ``tp`` group, by fingerprint:

- each rank projects the gradient (its local FSDP shard: the same elements on every ``tp`` rank
  of a data coordinate) on ``PROJECTIONS`` pseudo-random Gaussian vectors, the same on every rank,
  and takes its norm: ``PROJECTIONS + 1`` float64 numbers per parameter, one all-reduce (MAX of
  the numbers and of their negations) over the ``tp`` group for all of them;
- a parameter disagrees when a projection's spread over the ``tp`` ranks exceeds ``TOLERANCE``
  times the largest norm. For a difference ``d`` between two ranks' gradients the spread of a
  projection is ``|N(0, 1)| * ||d||``, so the test asks whether ``||d|| / ||g||`` is ``TOLERANCE``
  (2**-4) or more, with a margin of chance on either side:

  * agreeing gradients differ by 0 (deterministic kernels on the same bits: every CPU kernel,
    and almost every GPU one) or by the rounding of sums a nondeterministic kernel takes in
    another order. In fp32 (u = 2**-24) a sum of ``n`` terms reordered moves by at most
    ``2 (n - 1) u sum|terms|``: ``||d|| / ||g||`` stays under 2**-7 (a projection would then need
    an 8-sigma draw to reach 2**-4) while ``n`` times the terms' cancellation ``sum|t| / |sum t|``
    stays under 2**15, every rounding the worst one. Under bf16 autocast an output rounded to
    bf16 may round the other way: one bf16 unit, at most 2**-7 of the element, so again at most
    2**-7 of the norm, 8 sigma from 2**-4 (a k-fold amplification through later layers: 8/k);
  * a partial gradient differs from the next rank's by the other heads' share, of the order of
    the gradient itself (Qwen3's norms under Llama's plan: ``||d|| / ||g||`` above 0.5, see
    tests/test_sharded_stages.py). A projection then stays below 2**-4 with chance under 0.1
    (``|N(0, 1)| < 0.125``), all 16 with chance 1e-16; a difference of a tenth of the gradient
    goes unseen with chance 5e-6 (``0.47 ** 16``).

Every rank decides the same (the spread is all-reduced; a flag over the whole world follows), so
every rank raises :class:`PartialGradients` naming the parameters, before any weight changed. The
guard cannot see partials that happen to be equal (every rank's heads identical: never from a
random start) nor a parameter whose first gradient is zero on every rank.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from ...errors import ConfigError
from .sharded_mesh import ShardedMesh
from .sharding import local_tensors

PROJECTIONS = 16
TOLERANCE = 2.0 ** -4
SEED = 20_261_202  # of the projection vectors: any number, the same on every rank
CHUNK = 1 << 22  # elements projected at a time


class PartialGradients(ConfigError):
    """A tensor-parallel plan left replicated parameters whose gradients differ across ``tp``."""


def replicated_over_tp(named: Iterable[tuple[str, nn.Parameter]]) -> list[tuple[str, nn.Parameter]]:
    """The parameters tensor parallelism left whole: plain tensors, and DTensors whose mesh has no
    ``tp`` dimension (FSDP's, over the data dimensions)."""
    return [(n, p) for n, p in named if not isinstance(p, DTensor) or "tp" not in (p.device_mesh.mesh_dim_names or ())]


@torch.no_grad()
def fingerprints(grads: list[Optional[torch.Tensor]], device: torch.device) -> torch.Tensor:
    """``[len(grads), PROJECTIONS + 1]`` float64 on ``device``: each gradient's projections on the
    seeded Gaussian vectors, then its norm (a missing gradient: zeros). The vectors are drawn
    ``CHUNK`` elements at a time, so a large gradient needs no temporary of its size."""
    out = torch.zeros(len(grads), PROJECTIONS + 1, dtype=torch.float64, device=device)
    for i, grad in enumerate(grads):
        if grad is None:
            continue
        flat = local_tensors([grad])[0].detach().reshape(-1)
        draws = torch.Generator(device=flat.device).manual_seed(SEED)
        for start in range(0, flat.numel(), CHUNK):
            piece = flat[start:start + CHUNK].float()
            for k in range(PROJECTIONS):
                vector = torch.randn(piece.numel(), generator=draws, device=piece.device)
                out[i, k] += (piece * vector).sum(dtype=torch.float64).to(device)
            out[i, PROJECTIONS] += piece.pow(2).sum(dtype=torch.float64).to(device)
    out[:, PROJECTIONS].sqrt_()
    return out


def _on(group, device: torch.device) -> torch.device:
    """Where a collective of ``group`` reduces: the CPU for gloo, ``device`` for NCCL."""
    return torch.device("cpu") if dist.get_backend(group) == "gloo" else device


def disagreeing(named: list[tuple[str, nn.Parameter]], tp_group, device: torch.device) -> list[str]:
    """The names of ``named`` whose gradients differ across ``tp_group`` (collective over it;
    every rank of the group returns the same names)."""
    if not named:  # (the same on every rank of the group: they hold the same stages)
        return []
    local = fingerprints([p.grad for _, p in named], device)
    both = torch.cat([local, -local[:, :PROJECTIONS]], dim=1).to(_on(tp_group, device))
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=tp_group)
    both = both.cpu()
    spread = both[:, :PROJECTIONS] + both[:, PROJECTIONS + 1:]  # max - min of each projection
    scale = both[:, PROJECTIONS:PROJECTIONS + 1]
    bad = (spread > TOLERANCE * scale).any(dim=1)
    return [name for (name, _), b in zip(named, bad.tolist()) if b]


def check_tp_gradients(named: Iterable[tuple[str, nn.Parameter]], mesh: ShardedMesh, device: torch.device) -> None:
    """Raise :class:`PartialGradients` on every rank of the world when some ``tp`` group's
    replicated gradients disagree (collective: every rank calls it once, after the step's
    reductions and before its optimizer step)."""
    bad = disagreeing(replicated_over_tp(named), mesh.tp_mesh.get_group(), device)
    world = mesh.pipeline.world_group
    flag = torch.tensor([len(bad)], dtype=torch.int64, device=_on(world, device))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=world)
    if not flag.item():
        return
    every = [None] * dist.get_world_size(world)
    dist.all_gather_object(every, bad, group=world)
    raise PartialGradients(refusal(list({n for names in every for n in names}), mesh.layout.tp))


class TpGuard:
    """A runtime's check before its first update under tensor parallelism (none without it)."""

    def __init__(self, mesh: Optional[ShardedMesh], device: torch.device) -> None:
        self.mesh = mesh if mesh is not None and mesh.layout.tp > 1 else None
        self.device = device

    def before_update(self, named: Iterable[tuple[str, nn.Parameter]]) -> None:
        """:func:`check_tp_gradients` the first time (collective), nothing after."""
        if self.mesh is not None:
            mesh, self.mesh = self.mesh, None
            check_tp_gradients(named, mesh, self.device)


def refusal(names: list[str], tp: int) -> str:
    """The one line :class:`PartialGradients` says: how many parameters, each kind once (its name
    after the last layer or block index) with its count, the first in model order, and what to do."""
    names = sorted(names, key=lambda name: [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in name.split(".")])
    kinds = Counter(_inside_layer(name) for name in names)
    listed = ", ".join(f"{kind} x{count}" for kind, count in kinds.items())
    many = len(names) > 1
    return (f"tensor parallelism (tp={tp}): {len(names)} parameter{'s' if many else ''} the plan leaves replicated "
            f"got different gradients on the tp ranks ({listed}; the first: {names[0]}), as a parameter between a "
            "column-wise and a row-wise split does (each tp rank sees only its own heads there: a partial gradient); "
            "stopped before any weight changed. Give those modules a style in the tp plan (e.g. a DTensor Replicate "
            "weight fed a Shard input, or a per-head split) or leave the projections around them whole")


def _inside_layer(name: str) -> str:
    """``name`` after its last index (``"1.model.layers.0.self_attn.q_norm.weight"``: ``"self_attn.q_norm.weight"``)."""
    parts = name.split(".")
    return ".".join(parts[max((i + 1 for i, part in enumerate(parts) if part.isdigit()), default=0):])
