"""An option declared once, as a dataclass field: its default, help text and range live on the
field, and both the command line (typer's options) and a run file (``--config run.toml``) are
read from it, so no default or range is written a second time.

A field's flag is its name with dashes (``clip_grad_norm`` is ``--clip-grad-norm``), its key in
a run file the name itself (DESIGN.md, "A run as a file"). An option several commands share is
declared where it was first (``options.Ranks``) and a field takes it whole (:func:`shared`).
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, Field, field, fields
from typing import Callable, Optional

import typer

from ..errors import ConfigError
from .renamed import deprecated_option, renamed

Check = Callable[[str, object], None]  # (label, value): raises ConfigError naming the label


def option(default: object, help: str, *, short: tuple[str, ...] = (), least: Optional[int] = None,
           check: Optional[Check] = None, in_file: bool = True) -> Field:
    """A field declaring one option: ``least`` the smallest whole number it takes, ``check`` any
    other rule (both applied to a flag's value and to a run file's alike); ``in_file=False``: a
    flag with no key in a file (``--config`` itself)."""
    return field(default=default, metadata={"help": help, "short": short, "least": least, "check": check,
                                            "in_file": in_file})


def shared(declaration: typer.models.OptionInfo, *, least: Optional[int] = None, check: Optional[Check] = None) -> Field:
    """A field declaring an option another command declared first: its default and help are that declaration's."""
    return field(default=declaration.default, metadata={"declared": declaration, "least": least, "check": check})


def old_spelling(of: str, old_flag: str) -> Field:
    """A field for the old spelling of the field ``of`` (hidden, warned about, never in a run
    file): the run takes its value as ``of``'s."""
    return field(default=None, metadata={"declared": deprecated_option(old_flag, dashed(of)), "renamed_to": of,
                                         "in_file": False})


def dashed(name: str) -> str:
    """The flag of the field ``name`` (``clip_grad_norm``: ``--clip-grad-norm``)."""
    return "--" + name.replace("_", "-")


def flag(f: Field) -> str:
    """The option's long name on the command line."""
    declared = f.metadata.get("declared")
    return declared.param_decls[0] if declared is not None else dashed(f.name)


def in_file(f: Field) -> bool:
    """Whether the option has a key in a run file (an old spelling has none)."""
    return f.metadata.get("in_file", True)


def with_old_spellings(command: str, section: type, values: dict[str, object]) -> dict[str, object]:
    """``values`` of ``section`` with each old spelling given moved to its new name (warned about)."""
    moved = dict(values)
    for f in fields(section):
        new = f.metadata.get("renamed_to")
        if new is not None:
            moved[new] = renamed(command, flag(f), dashed(new), moved[f.name], moved[new])
            moved[f.name] = None
    return moved


def value_type(section: type, f: Field) -> type:
    """The field's type without ``Optional`` (``Optional[int]`` -> ``int``)."""
    kind = typing.get_type_hints(section)[f.name]
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if typing.get_origin(kind) is typing.Union else kind


def typer_options(section: type) -> tuple[tuple[str, object, object], ...]:
    """``section``'s options as :func:`~.option_group.option_group` takes them: (field, type,
    typer's declaration), in the order the fields are written."""
    hints = typing.get_type_hints(section)
    declared = []
    for f in fields(section):
        assert f.default is not MISSING, f"{section.__name__}.{f.name} has no default"
        info = f.metadata.get("declared") or typer.Option(f.default, flag(f), *f.metadata["short"], help=f.metadata["help"])
        assert info.default == f.default and info.param_decls[0] == flag(f), f.name
        declared.append((f.name, hints[f.name], info))
    return tuple(declared)


def check_value(f: Field, label: str, value: object) -> None:
    """Refuse (one line, :class:`ConfigError` naming ``label``) a value outside the field's range."""
    least = f.metadata.get("least")
    if value is None:
        return
    if least is not None and value < least:
        raise ConfigError(f"{label} must be at least {least}, got {value}")
    check = f.metadata.get("check")
    if check is not None:
        check(label, value)
