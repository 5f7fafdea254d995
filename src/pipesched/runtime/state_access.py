"""What a runtime's state is to the outside: checkpoints (the only way, besides a step, its step
count changes), the model's names, the whole model gathered, the bytes it holds.

:class:`StateAccess` is :class:`~.executor.PipelineRuntime`'s half that reads and writes its
state rather than stepping it; it reads the runtime's ``stages``, ``optimizer``, ``mesh``,
``model`` (its tied groups), ``strategy`` (its layout and coordinates), ``state_specs``, ``follower_specs``
and ``reductions``.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Iterable, Optional

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ..sharded_bytes import rank_state_bytes
from .checkpoints import checkpoint
from .checkpoints.checkpoint_names import same_name
from .checkpoints.checkpoint_pieces import Pieces
from .comm.expert_mesh import is_expert, pieces_mesh
from .guard import block_order
from .sharding.expert_parallel import expert_slice, whole_experts
from .sharding.sharded_measure import held_bytes, optimizer_slots
from .sharding.sharding import full_tensor


class StateAccess:
    """Checkpoints, names, gathers and held bytes of a :class:`~.executor.PipelineRuntime`."""

    # -- checkpoints: the only way the step count changes besides a step ----------------------

    def save_checkpoint(self, directory, keep: int = checkpoint.DEFAULT_KEEP, rename: Callable[[str], str] = same_name):
        """Checkpoint this run after its ``steps_done`` steps (collective): this rank's blocks under
        the unpipelined model's names (or ``rename``'s of them), a tied weight under its group's
        first name, and the optimizer, keeping the newest ``keep`` steps. Returns the step's folder."""
        view = self.checkpoint_module(rename)
        return checkpoint.save(directory, self.steps_done, view, self.optimizer, keep, self._expert_pieces(view))

    def load_checkpoint(self, path, rename: Callable[[str], str] = same_name) -> int:
        """Load a checkpoint saved under any schedule or rank count (collective), continue after
        its step; returns that step."""
        view = self.checkpoint_module(rename)
        self.steps_done = checkpoint.load(path, view, self.optimizer, self._expert_pieces(view))
        self.broadcast_tied()  # the group's first name's value, wherever the checkpoint came from
        return self.steps_done

    def _expert_pieces(self, view: nn.Module) -> Optional[Pieces]:
        """Under expert parallelism, the experts of ``view`` (this rank's ``1/ep`` of each MoE layer's,
        under the whole layer's names): saved and loaded as their rows of the whole tensors
        (:mod:`.checkpoints.checkpoint_pieces`), so that any EP degree or layout reads them back."""
        experts = self.mesh.experts
        if experts is None:
            return None
        named = {name: p for name, p in view.named_parameters() if is_expert(p)}
        device = next((p.device.type for p in view.parameters()), "cpu")
        sharded = next((p for p in named.values() if isinstance(p, DTensor)), None)  # FSDP over experts_mesh
        held = None if sharded is None else (sharded.device_mesh, tuple(sharded.placements))
        return Pieces(frozenset(named), partial(expert_slice, mesh=experts),
                      pieces_mesh(experts, held and held[0], device), held)

    def checkpoint_module(self, rename: Callable[[str], str] = same_name) -> nn.Module:
        """What a checkpoint holds of this rank (:func:`~.checkpoint_names.tied_view`)."""
        return checkpoint.tied_view(self.module(), self.model.tied, rename)

    def state_bytes(self) -> dict[str, dict[str, int]]:
        """This rank's parameters, gradients and optimizer state in bytes: ``measured`` (the
        storages it holds) and ``predicted`` (:func:`pipesched.sharded_bytes.rank_state_bytes`
        from the stages' parameter shapes and the layout; between steps, gradients kept)."""
        layout, tp_rank, shard_rank = self.strategy.layout, self.strategy.tp_rank, self.strategy.shard_rank
        # among the ranks holding the same experts, replica by replica: the shard's index
        expert_rank = 0 if self.mesh.experts is None else self.mesh.experts.replica_index % layout.expert_shards
        slots = optimizer_slots(self.optimizer)
        measured = {"params": 0, "grads": 0, "optimizer": 0}
        predicted = dict(measured)
        for s, stage in self.stages.items():
            for key, value in held_bytes(stage, self.optimizer).items():
                measured[key] += value
            expected = rank_state_bytes(self.state_specs[s], layout, tp_rank, shard_rank, slots, expert_rank=expert_rank)
            for key in predicted:
                predicted[key] += getattr(expected, key)
        # a tied weight's other copies on this rank hold no optimizer state (comm/tied_copies.py)
        predicted["optimizer"] -= rank_state_bytes(self.follower_specs, layout, tp_rank, shard_rank, slots).optimizer
        return {"measured": measured, "predicted": predicted}

    def module(self) -> nn.ModuleDict:
        """This rank's blocks as one module whose names are the unpipelined model's."""
        return nn.ModuleDict({index: block for stage in self.stages.values() for index, block in stage.blocks.items()})

    def named_parameters(self, unique: bool = False) -> Iterable[tuple[str, nn.Parameter]]:
        """This rank's parameters under the unpipelined model's names (a tied one under each of
        its names, or with ``unique`` once, under its first)."""
        seen = set()
        for stage in self.stages.values():
            for name, p in stage.global_named_parameters():
                if unique and id(p) in seen:
                    continue
                seen.add(id(p))
                yield name, p

    def grad_norm(self) -> float:
        """The whole model's norm of this step's reduced gradients, the same on every rank
        (collective): every rank's pieces, each element once (what --metrics logs)."""
        return self.strategy.grad_norm(self.reductions.counted, None)

    def gather_state_dict(self, dst: int = 0) -> Optional[dict[str, torch.Tensor]]:
        """The full model's state dict on rank ``dst`` (None elsewhere), unpipelined names."""
        local = {}
        for stage in self.stages.values():
            local.update({n: full_tensor(t) for n, t in stage.global_state_dict().items()})
        return self._gather_dicts(whole_experts(local, self.named_parameters(), self.mesh.experts), dst)

    def gather_gradients(self, dst: int = 0) -> Optional[dict[str, torch.Tensor]]:
        """The last step's gradients of the full model on rank ``dst`` (None elsewhere)."""
        local = {n: full_tensor(p.grad.detach().cpu()).clone() for n, p in self.named_parameters() if p.grad is not None}
        return self._gather_dicts(whole_experts(local, self.named_parameters(), self.mesh.experts), dst)

    def _gather_dicts(self, local: dict, dst: int) -> Optional[dict]:
        merged = self.mesh.merge_on(dst, local)
        return None if merged is None else dict(sorted(merged.items(), key=lambda kv: block_order(kv[0])))
