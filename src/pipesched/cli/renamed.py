"""Options renamed so that one name means one thing across commands; the old spelling still
works for one release, with a one-line warning.

``--dtype`` is the compute type in ``train`` (the runtime's precision); in ``advise`` it was the
activations' bytes per value, with other choices and another default, so there it is now
``--activation-dtype``. ``--json`` is a switch (print JSON) in ``simulate``, ``compare`` and
``advise``; in ``train`` it took a path, so there it is now ``--summary PATH``.
"""

from __future__ import annotations

from typing import Optional, TypeVar

import typer

from ..errors import ConfigError

T = TypeVar("T")


def renamed(command: str, old: str, new: str, old_value: Optional[T], new_value: Optional[T]) -> Optional[T]:
    """The option's value, from the new spelling or (with a warning on stderr) the old one."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise ConfigError(f"{old} is the old spelling of {new}: give {new} alone")
    typer.echo(f"pipesched: warning: {command} {old} is deprecated and goes in the next release: use {new}", err=True)
    return old_value
