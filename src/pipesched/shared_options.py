"""Options that the planning commands and ``pipesched train`` both take, declared once here
without typer (:class:`~pipesched.declared.Declared`): the planning commands' typer options are
generated from them (:mod:`pipesched.cli.options`) and the run's tree takes them whole
(:mod:`pipesched.training.config.run_config`). The memory limits are declared beside their rules
(:mod:`pipesched.memory_limits`); the gathers are placed by :mod:`pipesched.gather_placement`.
"""

from __future__ import annotations

import math
from typing import Optional

from .declared import Declared
from .errors import ConfigError

RANKS = Declared("--ranks", 4, "Pipeline ranks (devices), p.", short=("-p",))
CHUNKS = Declared("--chunks", None, "Chunks (stages) per rank, v; default per schedule.", short=("-v",))
RECOMPUTE_INPUT = Declared(
    "--recompute-input", None,
    "With --memory-limit: zb-auto may also recompute activations on some stages where that is "
    "faster than a leaner order; SHARE is what a recomputed stage keeps (its input) of its "
    "activations, e.g. 0.05. Where the sizes are known (train -s zb-auto measures them, simulate "
    "--activation-bytes KEEP,STASH,INPUT gives them) the share comes from them and this overrides it.",
)
GATHER_PLAN = Declared(
    "--gather-plan", "torch",
    "Where each rank gathers its FSDP-sharded stages (UNSHARD/RESHARD): torch: torch's window of the next 3 "
    "stages; auto: placed per rank from the costs and --gather-time, within --gather-limit.",
)
GATHER_TIME = Declared(
    "--gather-time", None,
    "With --gather-plan auto: one stage's all-gather time in cost units (one value, or one per stage).",
)
GATHER_LIMIT = Declared(
    "--gather-limit", None, "With --gather-plan auto: the most stages a rank may hold gathered at once.")


def check_recompute_input(share: float, limit: Optional[float]) -> None:
    """``--recompute-input`` is a share from 0 to below 1, and steers only a search under a limit."""
    if not (math.isfinite(share) and 0 <= share < 1):
        raise ConfigError(f"--recompute-input must be from 0 to below 1 (what a recomputed stage keeps of its activations), got {share:g}")
    if limit is None:
        raise ConfigError("--recompute-input needs --memory-limit: without a limit recomputing only costs time")
