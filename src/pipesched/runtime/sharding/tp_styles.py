"""The ``parallelize_module`` styles behind each name a tensor-parallel plan uses (:mod:`.tp_plans`).

A plan names a style per sub-module (``"colwise"``, ``"rowwise"``); :data:`STYLES` turns the name
and the kind of Linear into torch's style object. torch's own ``ColwiseParallel`` /
``RowwiseParallel`` serve ``nn.Linear``; transformers' ``Conv1D`` stores its weight ``(in, out)``,
so its styles split the other weight dim (:func:`~pipesched.sharded_bytes.tp_dims` says which, for
the byte model too).

A q/k norm between a column-wise projection and its row-wise partner sees only this rank's heads.
Left a plain tensor, its weight's gradient would be this rank's heads' share only (partial on each
rank, and nothing sums it). :class:`HeadsNorm` runs the norm on DTensors instead: its input is
this rank's slice of the heads (``Shard(heads_dim)``) and its weight a DTensor, so DTensor's
autograd sums a replicated weight's gradient over ``tp`` (torchtitan's ``SequenceParallel`` for
Qwen3's norms, with the heads as the sharded dim), and a reduction across the heads (OLMo 2's
mean over the whole projection) all-reduces.

``"rowwise_owned"`` returns a tensor of its own (Falcon adds into it in
place); ``"colwise_fused2"`` / ``"colwise_fused3"`` split a Linear (or Conv1D) fusing equal
projections so each rank holds a slice of every one (:class:`FusedColwise`).
"""

from __future__ import annotations

from functools import partial
from typing import Optional

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel
from torch.distributed.tensor.placement_types import _StridedShard

from ...errors import ConfigError
from ...sharded_bytes import tp_dims
from ..engine.split_backward import TRANSPOSED_LINEARS


def is_transposed(module: nn.Module) -> bool:
    """Whether ``module`` stores its weight ``(in, out)`` (transformers' Conv1D)."""
    return isinstance(module, tuple(TRANSPOSED_LINEARS))


def place_parameter(module: nn.Module, pname: str, device_mesh: DeviceMesh, placement, src_data_rank=0) -> None:
    """Replace ``module``'s parameter ``pname`` by a DTensor of it placed on ``device_mesh``
    (each rank keeping its piece of the whole, as torch's own styles do)."""
    param = getattr(module, pname)
    module.register_parameter(pname, nn.Parameter(
        distribute_tensor(param, device_mesh, [placement], src_data_rank=src_data_rank), requires_grad=param.requires_grad))


class _TransposedStyle:
    """A style for a Linear whose weight is stored ``(in, out)`` (transformers' Conv1D): the
    same split as its parent style, on the other weight dim."""

    def _partition_linear_fn(self, name, module, device_mesh):
        weight_dim, bias_dim = tp_dims(self.STYLE, transposed=True)
        for pname, placement in (("weight", Shard(weight_dim)), ("bias", Shard(bias_dim) if bias_dim is not None else Replicate())):
            if getattr(module, pname, None) is not None:
                place_parameter(module, pname, device_mesh, placement, self.src_data_rank)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if self.STYLE == "rowwise":
            self.desired_input_layouts = (Shard(-1),)
        return distribute_module(
            module, device_mesh, self._partition_linear_fn,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
        )


class TransposedColwise(_TransposedStyle, ColwiseParallel):
    STYLE = "colwise"


class TransposedRowwise(_TransposedStyle, RowwiseParallel):
    STYLE = "rowwise"


class SharedRopeKey(ParallelStyle):
    """DeepSeek's multi-head latent attention (transformers' ``DeepseekV3Attention``), its heads
    split by ``q_b_proj`` / ``kv_b_proj`` column-wise: ``kv_a_proj_with_mqa`` stays whole and
    outputs the key-value latent, then one rotary key (its last ``qk_rope_head_dim`` columns)
    that every head uses. The latent reaches the heads through ``kv_b_proj``, whose input
    gradient torch's column-wise style sums over ``tp``; the rotary key skips it and is expanded
    to this rank's heads only, so its gradient, and ``kv_a_proj_with_mqa``'s weight gradient with
    it, would hold this rank's heads' share alone. This style passes the rotary key through
    unchanged forward and sums its gradient over ``tp`` backward (Megatron's ``f``), as a DTensor
    replicated on the ``tp`` mesh whose gradient arrives partial."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        start = module.kv_lora_rank

        def shared_key(_linear, _args, out: torch.Tensor) -> torch.Tensor:
            key = DTensor.from_local(out[..., start:], device_mesh, [Replicate()], run_check=False)
            return torch.cat([out[..., :start], key.to_local(grad_placements=[Partial()])], dim=-1)

        module.kv_a_proj_with_mqa.register_forward_hook(shared_key)
        return module


class HeadsNorm(ParallelStyle):
    """A norm whose input holds this rank's heads on dim ``heads_dim`` (the column-wise
    projection's local output, viewed or not): computed on DTensors (input ``Shard(heads_dim)``,
    weight replicated or, when it holds one row per head or per channel, ``Shard(0)``), the
    output handed on as this rank's local slice, as the projection's was."""

    def __init__(self, heads_dim: int, split_weight: bool) -> None:
        super().__init__()
        self.heads_dim = heads_dim
        self.weight_placement = Shard(0) if split_weight else Replicate()

    def _partition(self, name, module, device_mesh):
        for pname, _ in list(module.named_parameters(recurse=False)):
            place_parameter(module, pname, device_mesh, self.weight_placement)

    def _prepare_input(self, module, inputs, device_mesh):
        return (DTensor.from_local(inputs[0], device_mesh, [Shard(self.heads_dim)], run_check=False), *inputs[1:])

    @staticmethod
    def _prepare_output(module, output, device_mesh):
        return output.to_local()

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, self._partition, self._prepare_input, self._prepare_output)


class RowwiseOwnedOutput(RowwiseParallel):
    """Row-wise, returning a tensor of its own: torch's returns a view of the reduced DTensor's,
    which autograd forbids modifying in place, and Falcon adds its attention's output into its
    MLP's in place (a copy: the same bits)."""

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        return RowwiseParallel._prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh).clone()


STYLE_FUSED3 = "colwise_fused3"  # the fused styles split alike (sharded_bytes.TP_STYLES)


class FusedColwise(_TransposedStyle, ColwiseParallel):
    """Column-wise over a Linear fusing ``parts`` projections of equal width (Phi-3's q|k|v and
    gate|up, each ``chunk``-ed or sliced apart by the module's forward): each rank holds the same
    slice of every part (``_StridedShard``), so its output is its heads' q, k and v (its columns'
    gate and up) in the module's order, and the gathered weight keeps transformers' layout (what
    checkpoints save). FSDP then shards the input features (:func:`fsdp_placement`)."""

    STYLE = "colwise"

    def __init__(self, parts: int) -> None:
        super().__init__()
        self.parts = parts

    def _partition_linear_fn(self, name, module, device_mesh):
        tp = device_mesh.size()
        for pname, dim in zip(("weight", "bias"), tp_dims(STYLE_FUSED3, is_transposed(module))):
            param = getattr(module, pname, None)
            if param is None:
                continue
            if dim is not None and param.shape[dim] % (self.parts * tp):
                raise ConfigError(f"tensor parallelism tp={tp} does not divide the {param.shape[dim] // self.parts} "
                                  f"outputs of each of the {self.parts} projections {name} fuses")
            placement = Replicate() if dim is None else _StridedShard(dim, split_factor=self.parts)
            place_parameter(module, pname, device_mesh, placement, self.src_data_rank)

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        return outputs.to_local()  # this rank's slice of every part, as the forward reads it


def fsdp_placement(param: nn.Parameter) -> Optional[Shard]:
    """FSDP2's ``shard_placement_fn``: dim 1 for a weight :class:`FusedColwise` split
    (torch 2.13's FSDP2 cannot shard a ``_StridedShard`` dim again: the gathered weight comes back
    wrong), its default (dim 0) for the others."""
    placements = getattr(param, "placements", ())
    return Shard(1) if param.ndim > 1 and any(isinstance(p, _StridedShard) and p.dim == 0 for p in placements) else None


STYLES = {("colwise", False): ColwiseParallel, ("rowwise", False): RowwiseParallel,
          ("colwise", True): TransposedColwise, ("rowwise", True): TransposedRowwise,
          ("rope_key", False): SharedRopeKey,
          # (batch, seq, heads, head_dim), one weight for every head: Qwen3's q/k norms
          ("head_norm", False): partial(HeadsNorm, 2, split_weight=False),
          # (batch, heads, seq, head_dim), after the transpose: Gemma 3's
          ("head_norm_heads_first", False): partial(HeadsNorm, 1, split_weight=False),
          # a weight row per head (Cohere's (heads, head_dim) on (batch, seq, heads, head_dim)) or per
          # channel (OLMo 2's (heads * head_dim) on the whole (batch, seq, heads * head_dim) projection)
          ("split_norm", False): partial(HeadsNorm, 2, split_weight=True),
          ("rowwise_owned", False): RowwiseOwnedOutput,
          ("colwise_fused2", False): partial(FusedColwise, 2), ("colwise_fused3", False): partial(FusedColwise, 3),
          ("colwise_fused3", True): partial(FusedColwise, 3)}


def style_for(style: str, module: nn.Module):
    """torch's style object that applies plan style ``style`` to ``module``."""
    return STYLES[style, is_transposed(module)]()

