"""The checkpoint checks before any rank starts, which ``pipesched train`` and the Python API
both make, in the same words: a checkpoint of another model or optimizer to resume from
(:func:`check_checkpoint_of`: ``train --resume`` through :func:`check_checkpoint_folder`, which also
refuses a folder it cannot write, and :func:`pipesched.hf.saving.load_checkpoint`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from ..errors import ConfigError


def check_checkpoint_folder(directory: Path, resume: bool, model_def, optimizer: Callable, *,
                            steps: Optional[int] = None, lock: bool = True) -> Optional[Path]:
    """Check (and create) the checkpoint folder ``directory``; return the checkpoint to resume
    from (with ``resume``: the newest intact one, which must hold this model, ``model_def``, and
    an optimizer of the factory ``optimizer``'s settings, and be before step ``steps`` where one
    is given), else None. A damaged checkpoint is passed over for the newest intact one, saying
    so. Then this process locks the folder for the run (under torchrun: rank 0's process), unless
    ``lock`` is False (a dry run: nothing changed)."""
    import torch

    from ..runtime.checkpoints import checkpoint
    from ..runtime.launching.launch import under_torchrun

    def resumable(found: Path) -> None:
        done = checkpoint.checkpoint_step(found)
        if steps is not None and done >= steps:
            raise ConfigError(f"--resume: {found} is after step {done}, and --steps {steps} asks for no more: raise --steps")
        shapes = checkpoint.model_shapes(model_def.build_block, model_def.num_blocks, model_def.tied,
                                         model_def.checkpoint_name)
        check_checkpoint_of(found, shapes, optimizer([torch.nn.Parameter(torch.zeros(1))]))

    owner = lock and (not under_torchrun() or os.environ["RANK"] == "0")  # torchrun: rank 0 locks and tidies, once per run
    return checkpoint.prepare_directory(directory, resume, lambda line: print(f"pipesched: {line}", file=sys.stderr,
                                                                              flush=True), owner, check=resumable)


def check_checkpoint_of(found: Path, shapes: Mapping[str, Sequence[int]], optimizer) -> None:
    """Refuse (CheckpointMismatch, one line) a checkpoint ``found`` that does not hold the whole
    model ``shapes`` describes (every entry at its shape, and none more: a larger model's checkpoint
    fills no part of a smaller one) or was saved by an optimizer of other settings than ``optimizer``'s."""
    from ..runtime.checkpoints import checkpoint

    checkpoint.check_matches(found, shapes, checkpoint.optimizer_settings(optimizer))
