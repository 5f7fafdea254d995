"""The ``parallelize_module`` styles behind each name a tensor-parallel plan uses (:mod:`.tp_plans`).

A plan names a style per sub-module (``"colwise"``, ``"rowwise"``); :data:`STYLES` turns the name
and the kind of Linear into torch's style object. torch's own ``ColwiseParallel`` /
``RowwiseParallel`` serve ``nn.Linear``; transformers' ``Conv1D`` stores its weight ``(in, out)``,
so its styles split the other weight dim (:func:`~pipesched.sharded_bytes.tp_dims` says which, for
the byte model too).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from ...sharded_bytes import tp_dims
from ..engine.split_backward import TRANSPOSED_LINEARS


def is_transposed(module: nn.Module) -> bool:
    """Whether ``module`` stores its weight ``(in, out)`` (transformers' Conv1D)."""
    return isinstance(module, tuple(TRANSPOSED_LINEARS))


class _TransposedStyle:
    """A style for a Linear whose weight is stored ``(in, out)`` (transformers' Conv1D): the
    same split as its parent style, on the other weight dim."""

    def _partition_linear_fn(self, name, module, device_mesh):
        weight_dim, bias_dim = tp_dims(self.STYLE, transposed=True)
        for pname, placement in (("weight", Shard(weight_dim)), ("bias", Shard(bias_dim) if bias_dim is not None else Replicate())):
            param = getattr(module, pname, None)
            if param is not None:
                module.register_parameter(pname, nn.Parameter(
                    distribute_tensor(param, device_mesh, [placement], src_data_rank=self.src_data_rank),
                    requires_grad=param.requires_grad))

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


STYLES = {("colwise", False): ColwiseParallel, ("rowwise", False): RowwiseParallel,
          ("colwise", True): TransposedColwise, ("rowwise", True): TransposedRowwise,
          ("rope_key", False): SharedRopeKey}


def style_for(style: str, module: nn.Module):
    """torch's style object that applies plan style ``style`` to ``module``."""
    return STYLES[style, is_transposed(module)]()

