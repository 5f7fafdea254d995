"""``pipesched train``'s layout checks: ``--dp``, ``--dp-shard``, ``--tp``, the batch split, torchrun's world.

Checked before any process starts (the ranks themselves would only fail later, one by one); the
batch split and the world are :mod:`pipesched.training.launch_checks`', which
``pipesched.hf.pipeline`` makes too.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from ...errors import ConfigError
from ...schedule import Schedule
from ..config.run_config import LayoutSection
from ..launch_checks import check_batch_split, check_world


def check_layout(plan: Optional[Schedule], layout: LayoutSection, batch_size: int,
                 environ: Mapping[str, str] = os.environ) -> None:
    """Raise ConfigError unless ``layout`` of ``plan`` can run ``batch_size`` samples per step
    here: the batch splits into (dp x dp_shard) x microbatches, and torchrun started exactly the
    layout's P x D x S x T ranks."""
    if plan is None:
        for flag, value in (("--dp", layout.dp), ("--dp-shard", layout.dp_shard), ("--tp", layout.tp)):
            if value != 1:
                raise ConfigError(f"{flag} needs a pipeline: the reference (--schedule none) is one process")
        return
    whole = layout.of(plan.ranks)
    check_batch_split(batch_size, whole.dp, plan.microbatches)
    named = f"--ranks {plan.ranks} x --dp {layout.dp}" + (
        f" x --dp-shard {layout.dp_shard} x --tp {layout.tp}" if layout.sharded else "")
    check_world(whole, named, environ)
