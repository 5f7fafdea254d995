"""``pipesched train``'s layout checks: ``--dp``, ``--dp-shard``, ``--tp``, the batch split, torchrun's world.

Checked before any process starts (the ranks themselves would only fail later, one by one); the
batch split and the world are :mod:`pipesched.training.launch_checks`', which
``pipesched.hf.pipeline`` makes too.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from ...environment import local_cores, torchrun_rank
from ...errors import ConfigError
from ...schedule import Schedule
from ..config.run_config import LayoutSection
from ..launch_checks import check_batch_split, check_world


def check_layout(plan: Optional[Schedule], layout: LayoutSection, batch_size: int,
                 environ: Mapping[str, str] = os.environ) -> None:
    """Raise ConfigError unless ``layout`` of ``plan`` can run ``batch_size`` samples per step
    here: the batch splits into (dp x dp_shard) x microbatches, torchrun started exactly the
    layout's P x D x S x T ranks, and without torchrun this machine can start them
    (:func:`local_world_limit`)."""
    if plan is None:
        for flag, value in (("--dp", layout.dp), ("--dp-shard", layout.dp_shard), ("--tp", layout.tp), ("--ep", layout.ep)):
            if value != 1:
                raise ConfigError(f"{flag} needs a pipeline: the reference (--schedule none) is one process")
        return
    whole = layout.of(plan.ranks)
    named = f"--ranks {plan.ranks} x --dp {layout.dp}" + (
        f" x --dp-shard {layout.dp_shard} x --tp {layout.tp}" if layout.sharded else "")
    limit = local_world_limit()
    if torchrun_rank(environ) is None and whole.world > limit:
        raise ConfigError(f"{named} needs {whole.world} processes, more than the {limit} this machine starts "
                          f"({LOCAL_PER_CORE} per CPU core, at least {LOCAL_FLOOR}, at most {LOCAL_CAP}): choose a "
                          "smaller layout, or launch it across machines with torchrun (docs/runtime.md)")
    check_batch_split(batch_size, whole.dp, plan.microbatches)
    check_world(whole, named, environ)


LOCAL_PER_CORE = 4  # local processes per CPU core: past that, a run only waits on its own ranks
LOCAL_FLOOR = 16  # the layouts the docs and tests show (--ranks 2 --dp-shard 8) start even on one core
LOCAL_CAP = 512  # whatever the cores: every process imports torch and holds its stages


def local_world_limit(cores: Optional[int] = None) -> int:
    """How many processes ``pipesched train`` starts on this machine at most (without torchrun):
    ``--ranks 2 --dp 5000`` would otherwise start 10,000, each importing torch, until the
    machine runs out of memory or process slots."""
    cores = cores or local_cores()
    return min(LOCAL_CAP, max(LOCAL_FLOOR, LOCAL_PER_CORE * cores))
