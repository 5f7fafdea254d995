"""A run file: ``pipesched train --config run.toml`` reads one, ``--print-config`` writes one
(``advise --config`` reads its model description the same way).

One table per section of :class:`~.run_config.RunConfig`, each key a field (a flag's long name
without its dashes). Reading refuses, in one line naming the key and the file, a key no section
has (with the nearest one there is), a value of the wrong type and a value out of its range:
the same range the flag has, from the same declaration. Writing leaves out what is not set (TOML
has no null) and what has no key (a deprecated spelling), so reading it back gives the same run.
"""

from __future__ import annotations

import difflib
import json
import math
import sys
from dataclasses import Field, fields
from pathlib import Path

from ...declared import check_value, in_file, value_type
from ...errors import ConfigError
from .run_config import SECTIONS, RunConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the tomli backport reads the same TOML 1.0
    import tomli as tomllib

TYPE_NAMES = {int: "a whole number", float: "a number", str: "a string", bool: "true or false", Path: "a path (a string)"}


def keyed_fields(sections: dict[str, type]) -> dict[str, tuple[type, Field]]:
    """Every key a file of ``sections`` may hold, as ``section.key``, with its section and field."""
    return {f"{name}.{f.name}": (section, f) for name, section in sections.items() for f in fields(section) if in_file(f)}


def read_run_file(path: Path, sections: dict[str, type] = SECTIONS) -> dict[str, object]:
    """The values ``path`` sets, by field name, one table per entry of ``sections`` (one line
    naming the file and key for a mistake)."""
    try:
        with open(path, "rb") as handle:
            tables = tomllib.load(handle)
    except OSError as err:
        raise ConfigError(f"--config {path}: cannot read it ({err.strerror})") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"--config {path}: not a TOML file ({err})") from None
    known = keyed_fields(sections)
    values: dict[str, object] = {}
    for table, keys in tables.items():
        if not isinstance(keys, dict):
            raise ConfigError(f"{path}: {table} = ... stands outside any table: "
                              f"write it under one of {', '.join(f'[{name}]' for name in sections)}")
        for key, value in keys.items():
            where = f"{table}.{key}"
            if where not in known:
                raise ConfigError(f"{path}: unknown key [{table}] {key}{_nearest(where, known)}")
            section, f = known[where]
            values[f.name] = _typed(f"{path}: [{table}] {key}", value_type(section, f), value)
            check_value(f, f"{path}: [{table}] {key}", values[f.name])
    return values


def _nearest(where: str, known: dict) -> str:
    """`` (did you mean ...?)``: the key in the table that has it, else the closest spelling."""
    key = where.split(".", 1)[1]
    close = [k for k in known if k.endswith(f".{key}")] or difflib.get_close_matches(where, known, n=1, cutoff=0.6)
    if not close:
        return ""
    table, key = close[0].split(".", 1)
    return f" (did you mean [{table}] {key}?)"


def _typed(label: str, kind: type, value: object) -> object:
    """``value`` as the field's type, or ConfigError saying what the key takes."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is Path and isinstance(value, str):
        return Path(value)
    if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    got = "true or false" if isinstance(value, bool) else f"{type(value).__name__} {value!r}"
    raise ConfigError(f"{label} must be {TYPE_NAMES[kind]}, got {got}")


def run_text(cfg: RunConfig) -> str:
    """``cfg`` as a run file: one table per section, its set values (``--config`` reads it back to ``cfg``)."""
    lines: list[str] = []
    for name in SECTIONS:
        section = getattr(cfg, name)
        lines.append(f"[{name}]")
        lines += [f"{f.name} = {_toml(getattr(section, f.name))}"
                  for f in fields(section) if in_file(f) and getattr(section, f.name) is not None]
        lines.append("")
    return "\n".join(lines)


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value)).replace("\x7f", "\\u007f")  # JSON's escapes are TOML's, DEL aside
