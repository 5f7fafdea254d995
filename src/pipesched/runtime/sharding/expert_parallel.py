"""Expert parallelism inside a stage: each MoE layer's routed experts split over the EP group,
tokens sent to their experts' ranks and the results brought back with ``all_to_all``.

Only the experts' compute moves. The router runs on every rank on its own tokens, as in one
process, and hands the experts module its choices (``top_k_index``, ``top_k_weights``); the
module then

1. **dispatches** each (token, choice) pair, sorted by expert (so by rank), to the rank holding
   that expert (one ``all_to_all`` of the per-expert counts, one of the hidden states);
2. **computes** there, with the family's own experts implementation on the rank's slice of
   ``gate_up_proj`` / ``down_proj``, each pair with weight 1 (an exact product), so the result is
   the expert's output unweighted;
3. **combines**: the outputs come back (``all_to_all`` with the sizes swapped), are weighted
   exactly as transformers weights them and summed per token in transformers' order: eager's
   ``index_add_`` into zeros in ascending expert order, the grouped / batched kernels' sum over
   the choices (:func:`combine`).

The token's sum is then the same additions of the same products as one process's; what may
differ is only each expert's matmul, run on another number of rows (a GEMM's blocking may
change its rounding: float32 about 1e-7 relative per layer, float64 1e-16). No capacity: no
token is dropped. The backward of each ``all_to_all`` is the ``all_to_all`` back
(:class:`_Exchange`); every rank of an EP group runs the same program, so their exchanges pair
one for one, recomputed forwards included.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from ...errors import ConfigError
from ..comm.expert_mesh import ExpertMesh, is_expert
from ..engine.pair_turns import await_exchange
from ...expert_plans import ExpertPlan

SPLIT = ("gate_up_proj", "down_proj")  # the experts' fused weights, dim 0 the expert


class _Exchange(torch.autograd.Function):
    """``all_to_all_single`` of ``x``'s rows (``send`` to each rank, ``receive`` from each) whose
    backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list, receive: list, group: Any) -> torch.Tensor:
        ctx.send, ctx.receive, ctx.group = send, receive, group
        return exchange(x, send, receive, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return exchange(grad, ctx.receive, ctx.send, ctx.group), None, None, None


def exchange(x: torch.Tensor, send: list, receive: list, group: Any) -> torch.Tensor:
    """The rows of ``x`` sent ``send[r]`` to rank ``r`` of ``group``, ``receive[r]`` received from it
    (over gloo through host memory). Started async and waited for in :func:`await_exchange`:
    there, in an overlapped pair run interleaved, the pair's other half computes first."""
    on_host = dist.get_backend(group) == "gloo" and x.device.type != "cpu"
    payload = (x.cpu() if on_host else x).contiguous()
    out = payload.new_empty((sum(receive), *x.shape[1:]))
    work = dist.all_to_all_single(out, payload, receive, send, group=group, async_op=True)
    await_exchange(work)  # an interleaved pair's other half runs meanwhile; the wait is exposed time
    return out.to(x.device) if on_host else out


def combine(module: nn.Module, weighted: torch.Tensor, top_k_index: torch.Tensor) -> torch.Tensor:
    """Each token's weighted expert outputs ``weighted`` ``(tokens, k, hidden)`` summed as the
    module's implementation sums them: eager adds them into zeros in ascending expert order
    (``index_add_`` expert by expert), the grouped and batched kernels sum over the ``k`` choices."""
    if getattr(module.config, "_experts_implementation", "eager") not in (None, "eager"):
        return weighted.sum(dim=1)
    ranked = weighted.gather(1, top_k_index.argsort(dim=1, stable=True)[..., None].expand_as(weighted))
    total = torch.zeros_like(ranked[:, 0])
    for choice in range(ranked.shape[1]):
        total = total + ranked[:, choice]
    return total


def expert_outputs(module: nn.Module, rows: torch.Tensor, local_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each of ``rows`` through this rank's expert ``local_ids`` names, by the family's own experts
    implementation with weight 1 (an exact product): the expert's output, unweighted. Where no
    row came, the experts' weights still get a gradient (zeros, as one process's stacked weight
    does): FSDP's reduce-scatter takes one from every rank holding the same experts."""
    ones = torch.ones((rows.shape[0], 1), dtype=dtype, device=rows.device)
    outputs = type(module).forward(module, rows, local_ids[:, None], ones)
    if not rows.shape[0]:
        outputs = outputs + sum(getattr(module, weight)[:0].sum() for weight in SPLIT)
    return outputs


def dispatched_forward(module: nn.Module, mesh: ExpertMesh, local: int, hidden_states: torch.Tensor,
                       top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts module's forward under expert parallelism (module doc); ``local``: experts per rank."""
    tokens, k = top_k_index.shape
    ids = top_k_index.reshape(-1)
    order = torch.argsort(ids, stable=True)
    per_expert = torch.bincount(ids, minlength=local * mesh.ep)
    # arriving[source, expert]: rows each rank sends each of this rank's experts
    arriving = exchange(per_expert.view(mesh.ep, local), [1] * mesh.ep, [1] * mesh.ep, mesh.ep_group)
    send = per_expert.view(mesh.ep, local).sum(dim=1).tolist()
    receive = arriving.sum(dim=1).tolist()
    rows = _Exchange.apply(hidden_states[order // k], send, receive, mesh.ep_group)
    experts_here = torch.arange(local, device=arriving.device).repeat(mesh.ep)
    local_ids = torch.repeat_interleave(experts_here, arriving.reshape(-1))
    outputs = expert_outputs(module, rows, local_ids, top_k_weights.dtype)
    back = _Exchange.apply(outputs, receive, send, mesh.ep_group)
    unsorted = back[torch.argsort(order)].view(tokens, k, -1)
    weighted = unsorted * top_k_weights[..., None]
    return combine(module, weighted, top_k_index).to(hidden_states.dtype)


def split_experts(stages: dict[int, nn.Module], mesh: ExpertMesh, plan: ExpertPlan) -> list[nn.Parameter]:
    """Keep, in every experts module of ``stages`` that ``plan`` names, this rank's ``1/ep`` of the
    experts (their weights as the one process initialised them) and route its forward through
    :func:`dispatched_forward`; returns the expert parameters kept. Each is marked with
    ``expert_replica`` (this rank's index among the ranks holding the same experts: the gradient
    norm counts it at index 0, :mod:`..comm.grad_norm`)."""
    local = plan.experts // mesh.ep
    kept = []
    for stage in stages.values():
        for name, module in stage.named_modules():
            if not plan.matches(name):
                continue
            for weight in SPLIT:
                full = getattr(module, weight, None)
                if full is None or full.dim() != 3 or full.shape[0] != plan.experts:
                    raise ConfigError(f"{name}.{weight}: expected the {plan.experts} experts' weights stacked on "
                                      f"dim 0, found {None if full is None else tuple(full.shape)}")
                piece = nn.Parameter(full.detach()[mesh.ep_rank * local:(mesh.ep_rank + 1) * local].clone(),
                                     requires_grad=full.requires_grad)
                piece.expert_replica = mesh.replica_index
                setattr(module, weight, piece)
                kept.append(piece)
            module.num_experts = local
            module.forward = partial(dispatched_forward, module, mesh, local)
    return kept


def expert_slice(tensor: torch.Tensor, mesh: ExpertMesh) -> tuple[torch.Tensor, int, int]:
    """This rank's experts in ``tensor`` (an expert parameter :func:`split_experts` kept, or optimizer
    state of its shape), the global index of the first (in the whole layer) and the layer's routed
    experts: where its rows sit in transformers' stacked tensor, what a checkpoint records (the
    one place that knows how a rank holds its experts: whole, the ``ep_rank``-th ``1/ep``; or
    FSDP-sharded over the ranks holding the same experts, :func:`shard_experts`: a DTensor whose
    rows here are its ``expert_shard`` coordinate's ``torch.chunk`` of those)."""
    rows = tensor.shape[0]  # this EP rank's experts (a DTensor's: its whole shape)
    if not isinstance(tensor, DTensor):
        return tensor, mesh.ep_rank * rows, mesh.ep * rows
    held = tensor.device_mesh
    shard = held.get_local_rank("expert_shard")
    return tensor.to_local(), mesh.ep_rank * rows + shard * -(-rows // held["expert_shard"].size()), mesh.ep * rows


def shard_experts(stage: nn.Module, mesh: DeviceMesh, reshard_after_forward: bool) -> None:
    """FSDP2 on every experts module of ``stage`` over ``mesh``, the ranks holding the same experts
    (torchtitan's "efsdp": ``fully_shard(experts, mesh=efsdp_mesh)`` before the blocks'): each
    rank keeps ``1/expert_shards`` of its experts between computes, the all-gather and the
    reduce-scatter run inside the replica group, whose reduce-scatter is then the experts' whole
    reduction (HSDP with replicas: then the all-reduce over them). Before the blocks are sharded
    (their groups leave these parameters to this one). Each shard's ``expert_replica`` is this rank's
    index among the replicas holding it (the gradient norm counts it at 0)."""
    replica = mesh.get_local_rank("expert_replicate") if mesh.ndim > 1 else 0
    holders = [m for m in stage.modules() if any(is_expert(p) for p in m.parameters(recurse=False))]
    for module in holders:
        fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward)
        for p in module.parameters(recurse=False):
            p.expert_replica = replica


def whole_experts(local: dict, named: Iterable[tuple[str, nn.Parameter]], mesh: Optional[ExpertMesh]) -> dict:
    """``local`` (tensors by name) with each expert parameter's tensor among ``named`` gathered over
    the EP group, in its ranks' order: every expert, in transformers' stacked layout (collective
    over the EP group, whose ranks hold the same stages)."""
    if mesh is None:
        return local
    for name in sorted({n for n, p in named if is_expert(p) and n in local}):
        piece = local[name].contiguous()
        parts = [torch.empty_like(piece) for _ in range(mesh.ep)]
        dist.all_gather(parts, piece, group=mesh.ep_group)
        local[name] = torch.cat(parts)
    return local
