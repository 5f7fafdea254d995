"""``pipesched train``'s layout checks: ``--dp``, ``--dp-shard``, ``--tp``, the batch split, torchrun's world.

Checked before any process starts (the ranks themselves would only fail later, one by one).
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from ..environment import torchrun_rank
from ..errors import ConfigError
from ..schedule import Schedule

def check_batch_split(batch_size: int, dp: int, microbatches: int) -> None:
    """Raise ConfigError unless ``batch_size`` splits into ``dp`` shards of ``microbatches`` equal microbatches."""
    m = microbatches
    if batch_size % (dp * m):
        raise ConfigError(
            f"--batch-size {batch_size} does not split into {m} equal microbatches"
            + (f" on each of {dp} replicas" if dp > 1 else "") + f": use a multiple of {dp * m}"
        )


def check_layout(plan: Optional[Schedule], dp: int, batch_size: int, environ: Mapping[str, str] = os.environ,
                 dp_shard: int = 1, tp: int = 1) -> None:
    """Raise ConfigError unless ``dp`` replicas x ``dp_shard`` shards x ``tp`` tensor-parallel ranks
    of ``plan`` can run ``batch_size`` samples per step here: the batch splits into (dp x dp_shard)
    x microbatches, and torchrun started exactly P x D x S x T ranks."""
    for flag, value in (("--dp-shard", dp_shard), ("--tp", tp)):
        if value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    if plan is None:
        for flag, value in (("--dp", dp), ("--dp-shard", dp_shard), ("--tp", tp)):
            if value != 1:
                raise ConfigError(f"{flag} needs a pipeline: the reference (--schedule none) is one process")
        return
    check_batch_split(batch_size, dp * dp_shard, plan.microbatches)
    launched = torchrun_rank(environ)
    world = plan.ranks * dp * dp_shard * tp
    if launched is not None and launched.world != world:
        layout = f"--ranks {plan.ranks} x --dp {dp}" + (f" x --dp-shard {dp_shard} x --tp {tp}" if world != plan.ranks * dp else "")
        raise ConfigError(f"torchrun started {launched.world} processes but {layout} needs {world}: "
                          f"use --nproc-per-node x --nnodes = {world}")


def check_sharding(model_def, dp_shard: int, tp: int) -> None:
    """What sharded stages cannot do yet, and a model ``tp`` cannot split: one line each, before any rank starts."""
    if dp_shard == 1 and tp == 1:
        return
    if tp > 1 and model_def.tp_plan is None:
        raise ConfigError(f"--tp {tp}: --model {model_def.name} has no tensor-parallel plan (docs/layouts.md lists "
                          "the models that have one, and why the others have none)")
    for heads in model_def.heads:
        if heads % tp:
            raise ConfigError(f"--tp {tp} does not divide the {heads} attention heads of --model {model_def.name}")
