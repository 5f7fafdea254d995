"""``pipesched checkpoint verify DIR``: check every checkpoint of a folder against its manifest.

No torch needed: the manifest holds each file's size and SHA-256 (see
``pipesched/runtime/checkpoint_files.py``). One line per step; exit 0 when every step is
intact, 1 when one is damaged, 2 when the folder holds no checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import ConfigError
from . import app

checkpoint_app = typer.Typer(help="Checkpoint folders: verify them.", no_args_is_help=True)
app.add_typer(checkpoint_app, name="checkpoint")


@checkpoint_app.command("verify")
def verify(directory: Path = typer.Argument(..., help="A --checkpoint-dir folder (or one step-NNNNNN folder in it).")) -> None:
    """Check each checkpoint's files against its manifest: one line per step, exit 1 if one is damaged."""
    from ..runtime.checkpoints.checkpoint_files import (
        STEP_DIR,
        check_step,
        complete_checkpoints,
    )

    if not directory.is_dir():
        raise ConfigError(f"{str(directory)!r} is not a folder")
    steps = [directory] if STEP_DIR.match(directory.name) else complete_checkpoints(directory)
    if not steps:
        raise ConfigError(f"{str(directory)!r} holds no checkpoint (step-NNNNNN folders)")
    damaged = 0
    for step in steps:
        problem = check_step(step)
        if problem is None:
            typer.echo(f"{step.name}: intact")
        else:
            damaged += 1
            typer.echo(f"{step.name}: damaged: {problem}")
    if damaged:
        raise typer.Exit(code=1)
