"""``pipesched train``'s data-parallel layout checks: ``--dp``, the batch split, torchrun's world.

Checked before any process starts (the ranks themselves would only fail later, one by one).
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

import typer

from ..environment import torchrun_rank
from ..errors import ConfigError
from ..schedule import Schedule

DP_HELP = "Data-parallel replicas of the pipeline: --ranks x --dp processes, each replica on its shard of --batch-size."
DTYPE_HELP = "fp32, or bf16: fp32 weights and optimizer state, bf16 compute (autocast) and stage-boundary tensors."
Dp = typer.Option(1, "--dp", help=DP_HELP)
Dtype = typer.Option("fp32", "--dtype", help=DTYPE_HELP)


def check_batch_split(batch_size: int, dp: int, microbatches: int) -> None:
    """Raise ConfigError unless ``batch_size`` splits into ``dp`` shards of ``microbatches`` equal microbatches."""
    m = microbatches
    if batch_size % (dp * m):
        raise ConfigError(
            f"--batch-size {batch_size} does not split into {m} equal microbatches"
            + (f" on each of {dp} replicas" if dp > 1 else "") + f": use a multiple of {dp * m}"
        )


def check_layout(plan: Optional[Schedule], dp: int, batch_size: int, environ: Mapping[str, str] = os.environ) -> None:
    """Raise ConfigError unless ``dp`` replicas of ``plan`` can run ``batch_size`` samples per
    step here: the batch splits into dp x microbatches, and torchrun started exactly P x D ranks."""
    if plan is None:
        if dp != 1:
            raise ConfigError("--dp needs a pipeline: the reference (--schedule none) is one process")
        return
    check_batch_split(batch_size, dp, plan.microbatches)
    launched = torchrun_rank(environ)
    if launched is not None and launched.world != plan.ranks * dp:
        raise ConfigError(
            f"torchrun started {launched.world} processes but --ranks {plan.ranks} x --dp {dp} needs {plan.ranks * dp}: "
            f"use --nproc-per-node x --nnodes = {plan.ranks * dp}"
        )
