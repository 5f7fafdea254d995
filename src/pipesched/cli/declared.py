"""typer's options, generated from the options declared once as dataclass fields
(:mod:`pipesched.declared`): the one place the command line meets them. A declaration shared by
several commands (:class:`~pipesched.declared.Declared`) becomes one ``typer.Option`` here too.
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, fields

import typer

from ..declared import Declared, dashed, declaration, flag
from .renamed import renamed


def typer_option(declared: Declared) -> typer.models.OptionInfo:
    """``declared`` as typer's declaration of an option."""
    return typer.Option(declared.default, declared.flag, *declared.short, help=declared.help, hidden=declared.hidden)


def typer_options(section: type) -> tuple[tuple[str, object, object], ...]:
    """``section``'s options as :func:`~.option_group.option_group` takes them: (field, type,
    typer's declaration), in the order the fields are written."""
    hints = typing.get_type_hints(section)
    declared = []
    for f in fields(section):
        assert f.default is not MISSING, f"{section.__name__}.{f.name} has no default"
        declared.append((f.name, hints[f.name], typer_option(declaration(f))))
    return tuple(declared)


def with_old_spellings(command: str, section: type, values: dict[str, object]) -> dict[str, object]:
    """``values`` of ``section`` with each old spelling given moved to its new name (warned about)."""
    moved = dict(values)
    for f in fields(section):
        new = f.metadata.get("renamed_to")
        if new is not None:
            moved[new] = renamed(command, flag(f), dashed(new), moved[f.name], moved[new])
            moved[f.name] = None
    return moved
