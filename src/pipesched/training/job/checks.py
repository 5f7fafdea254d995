"""``pipesched train``'s own checks before a process starts (one line, exit 2), besides those
``pipesched.hf.pipeline`` makes too (:mod:`pipesched.training.launch_checks`): a batch no machine
holds, checkpoint options that need one another. The checks that need no torch run before torch
is imported, so plain mistakes are answered at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ...environment import physical_memory
from ...errors import ConfigError


def check_batch_fits(model_def, batch_size: int, seed: int) -> None:
    """Refuse a batch whose inputs, targets and block outputs alone exceed the machine's memory
    (a floor of what a step holds: shapes come from one sample run on the meta device)."""
    from ...runtime.engine.shapes import infer_boundary_shapes

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
    """The checkpoint options on their own (the folder itself is checked before launch:
    :func:`pipesched.training.launch_checks.check_checkpoint_folder`)."""
    if directory is not None:
        from ...runtime.checkpoints.folder_lock import (
            check_lock_file,  # pure Python: answers before torch is imported
        )

        check_lock_file(directory)
    if directory is None:
        if every is not None:
            raise ConfigError("--checkpoint-every needs --checkpoint-dir (where to write the checkpoints)")
        if resume:
            raise ConfigError("--resume needs --checkpoint-dir (the folder of the run to continue)")
