"""Layouts that cannot run, refused in one line before any rank starts (pure: no torch).

- the product of the dimensions is not the world size, or ``tp`` does not divide the attention
  heads, the key-value heads or the hidden size (:meth:`ParallelLayout.check`);
- ``dp_shard`` cuts a stage into more shards than it has elements to give: some rank would hold
  no element of any of the stage's parameters (FSDP shards dim 0 of each, :mod:`.sharded_bytes`);
- ``dp_shard`` does not divide the dim FSDP shards a fused projection on (Phi-3's and GPT-2's
  interleaved pieces: their input features, :data:`~.sharded_bytes.FUSED_STYLES`), which torch 2.13's
  FSDP2 shards only evenly (it raises inside every rank otherwise);
- a gradient reduction the backend cannot run: gloo has no ``PREMUL_SUM``, which FSDP2 picks for
  fp32/bf16 gradients as soon as a divide factor other than the shard count is set (torch 2.13
  ``_get_gradient_divide_factors``); sharded stages force SUM reductions and divide once
  themselves, so only a configuration that asks for FSDP's own division is refused.
"""

from __future__ import annotations

from typing import Optional, Sequence

from .errors import ConfigError
from .parallel_layout import ParallelLayout
from .sharded_bytes import ParamSpec, empty_shards

# reduce dtypes FSDP2 lets the collective divide (other dtypes get a pre- and post-divide around a SUM)
COLLECTIVE_DIVIDED_DTYPES = ("float32", "bfloat16")


def check_stage_shards(layout: ParallelLayout, stages: Sequence[Sequence[ParamSpec]]) -> None:
    """Refuse a layout under which some rank of some stage would hold none of its parameters, or
    that cuts a fused projection's input features unevenly."""
    for index, specs in enumerate(stages):
        uneven = sorted({s.shape[s.fsdp_dim] for s in specs if s.fsdp_dim and s.shape[s.fsdp_dim] % layout.dp_shard})
        if uneven:
            raise ConfigError(
                f"dp_shard={layout.dp_shard} does not divide the {uneven[0]} input features of a fused projection "
                f"in stage {index}, which FSDP2 shards there only evenly: use a dp_shard that divides {uneven[0]}"
            )
        empty = empty_shards(specs, layout)
        if empty:
            rows = max((s.shape[0] if s.shape else 1) for s in specs) if specs else 0
            raise ConfigError(
                f"dp_shard={layout.dp_shard} cuts stage {index} into more shards than it has elements to give "
                f"(its largest parameter has {rows} rows along the sharded dim): use a smaller dp_shard or fewer stages"
            )


def check_reduction(layout: ParallelLayout, backend: str, reduce_dtype: str = "float32",
                    divide_factor: Optional[float] = None, force_sum: bool = True) -> None:
    """Refuse a gradient reduction ``backend`` cannot run (gloo and FSDP's ``PREMUL_SUM``)."""
    if backend != "gloo" or force_sum or reduce_dtype not in COLLECTIVE_DIVIDED_DTYPES:
        return
    if divide_factor is not None and divide_factor != layout.dp_shard:
        raise ConfigError(
            f"gloo cannot run FSDP's {reduce_dtype} gradient reduction with a divide factor of {divide_factor} "
            "(it needs PREMUL_SUM): force SUM reductions and divide once, or run on NCCL"
        )


def check_layout(layout: ParallelLayout, world: int, *, heads: Optional[int] = None, kv_heads: Optional[int] = None,
                 hidden: Optional[int] = None, stages: Sequence[Sequence[ParamSpec]] = (), backend: str = "gloo",
                 reduce_dtype: str = "float32", divide_factor: Optional[float] = None, force_sum: bool = True) -> None:
    """Every refusal above, in the order a user fixes them (world first); ConfigError, one line."""
    layout.check(world, heads=heads, kv_heads=kv_heads, hidden=hidden)
    check_stage_shards(layout, stages)
    check_reduction(layout, backend, reduce_dtype, divide_factor, force_sum)
