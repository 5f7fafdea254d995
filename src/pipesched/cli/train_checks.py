"""Every ``pipesched train`` option checked before a process starts (one line, exit 2).

A value the ranks would only choke on after spawning (a NaN learning rate, a seed torch's
generators refuse, a batch no machine holds, a resume with nothing to resume) is refused here
with a line that says what would be valid. The checks that need no torch run before torch is
imported, so plain mistakes are answered at once.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

from ..bounds import MAX_TIMEOUT_S
from ..environment import physical_memory
from ..errors import ConfigError

FLOAT32_MAX = 3.4028234663852886e38
# numpy's seed range; every generator seed derived from one (seed + block for the weights,
# 1_000_003 * seed + step for the data) then stays inside torch.manual_seed's
MAX_SEED = 2**32 - 1


# the numeric options' rules past a least whole number, each (label, value): the label is the
# flag, or the key and file a run file gave it in (run_config.py declares which option takes which)
def check_lr(label: str, lr: float) -> None:
    if not (math.isfinite(lr) and 0 < lr <= FLOAT32_MAX):
        raise ConfigError(f"{label} must be a finite number above 0 (at most {FLOAT32_MAX:.3g}, float32's largest), got {lr:g}")


def check_timeout(label: str, timeout: float) -> None:
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_S):
        raise ConfigError(f"{label} must be a number of seconds above 0 and at most {MAX_TIMEOUT_S} (a year), got {timeout:g}")


def check_seed(label: str, seed: int) -> None:
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"{label} must be a whole number from 0 to {MAX_SEED}, got {seed}")


def check_positive(label: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{label} must be a finite number above 0, got {value:g}")


def check_share(label: str, share: float) -> None:
    if not (math.isfinite(share) and 0 < share < 1):
        raise ConfigError(f"{label} must be above 0 and below 1 (the share of --data held out), got {share:g}")


def check_weight_decay(label: str, value: float) -> None:
    if not (math.isfinite(value) and 0 <= value < 1):
        raise ConfigError(f"{label} must be from 0 to below 1, got {value:g}")


def check_batch_fits(model_def, batch_size: int, seed: int) -> None:
    """Refuse a batch whose inputs, targets and block outputs alone exceed the machine's memory
    (a floor of what a step holds: shapes come from one sample run on the meta device)."""
    from ..runtime.engine.shapes import infer_boundary_shapes

    have = physical_memory()
    x, y = model_def.batch(0, 1, seed)
    blocks = [range(i, i + 1) for i in range(model_def.num_blocks)]
    outputs = infer_boundary_shapes(model_def.build_block, blocks, x)
    per_sample = x.nbytes + y.nbytes + sum(boundary.nbytes for boundary in outputs)
    if have is not None and per_sample * batch_size > have:
        raise ConfigError(
            f"--batch-size {batch_size}: a step would hold at least {_gib(per_sample * batch_size)} (inputs, "
            f"targets, each block's output), more than this machine's {_gib(have)}: use at most {have // per_sample}"
        )


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


def check_checkpoint_flags(directory: Optional[Path], every: Optional[int], resume: bool) -> None:
    """The checkpoint options on their own (the folder is checked by :func:`check_checkpointing`)."""
    if directory is not None:
        from ..runtime.checkpoints.folder_lock import (
            check_lock_file,  # pure Python: answers before torch is imported
        )

        check_lock_file(directory)
    if directory is None:
        if every is not None:
            raise ConfigError("--checkpoint-every needs --checkpoint-dir (where to write the checkpoints)")
        if resume:
            raise ConfigError("--resume needs --checkpoint-dir (the folder of the run to continue)")


def check_checkpointing(directory: Optional[Path], resume: bool, steps: int, model_def, optimizer: str,
                        lr: float, lock: bool = True) -> Optional[Path]:
    """Check (and create) the checkpoint folder; return the checkpoint to resume from.

    A checkpoint of another model or optimizer is refused here (CheckpointMismatch), a damaged
    one passed over for the newest intact one, saying so. Then this process locks the folder
    for the run (under torchrun: rank 0's process), unless ``lock`` is False (a dry run: nothing changed)."""
    if directory is None:
        return None
    import typer

    from ..runtime.checkpoints import checkpoint
    from ..runtime.launching.launch import under_torchrun
    from ..training.optimizers import make_optimizer

    def resumable(found: Path) -> None:
        done = checkpoint.checkpoint_step(found)
        if done >= steps:
            raise ConfigError(f"--resume: {found} is after step {done}, and --steps {steps} asks for no more: raise --steps")
        import torch

        probe = make_optimizer(optimizer, lr)([torch.nn.Parameter(torch.zeros(1))])
        checkpoint.check_matches(found, checkpoint.model_shapes(model_def.build_block, model_def.num_blocks, model_def.tied,
                                                         model_def.checkpoint_name),
                                 checkpoint.optimizer_settings(probe))

    owner = lock and (not under_torchrun() or os.environ["RANK"] == "0")  # torchrun: rank 0 locks and tidies, once per run
    return checkpoint.prepare_directory(directory, resume, lambda line: typer.echo(f"pipesched: {line}", err=True),
                                        owner, check=resumable)
