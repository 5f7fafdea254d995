"""``pipesched train``'s options, generated from the run's one declaration
(:class:`~pipesched.training.config.run_config.RunConfig`), with ``--config FILE.toml`` and
``--print-config``.

The command takes one ``cfg: RunConfig``. A flag given on the command line overrides the file; a
flag left out takes the file's value, else its default. Each value is checked against its range
where it was given: a flag's refusal names the flag, a file's the key and the file.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import fields
from pathlib import Path
from typing import Callable, Optional

import typer

from ..declared import check_value, flag
from ..training.config.run_config import SECTIONS, RunConfig
from ..training.config.run_file import read_run_file, run_text
from .declared import typer_options, with_old_spellings

Config = typer.Option(None, "--config", help="Read the run from this TOML file (one table per option group, "
                      "docs/training.md); flags given as well override it.")
PrintConfig = typer.Option(False, "--print-config", help="Print the resolved run as TOML (what --config reads) "
                           "and stop, without training.")
FROM_DEFAULT = "DEFAULT"  # click's ParameterSource for a flag left out


def run_options(command: Callable[[RunConfig], None]) -> Callable:
    """Give ``command`` every option of a run in place of its one ``cfg: RunConfig`` parameter."""
    declared = [(name, option) for name, section in SECTIONS.items() for option in typer_options(section)]
    assert len({field for _, (field, _, _) in declared}) == len(declared), "two sections name one option"
    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
              inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=Config, annotation=Optional[Path]),
              inspect.Parameter("print_config", inspect.Parameter.KEYWORD_ONLY, default=PrintConfig, annotation=bool)]
    params += [inspect.Parameter(field, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=kind)
               for _, (field, kind, info) in declared]

    @functools.wraps(command)
    def run(ctx: typer.Context, config: Optional[Path], print_config: bool, **given) -> None:
        cfg = resolved(given, read_run_file(config) if config is not None else {},
                       lambda name: ctx.get_parameter_source(name).name == FROM_DEFAULT)
        if print_config:
            typer.echo(run_text(cfg), nl=False)
            return
        command(cfg)

    run.__signature__ = inspect.Signature(params, return_annotation=None)
    run.__annotations__ = {p.name: p.annotation for p in params}
    del run.__wrapped__  # typer reads the signature above, not the command's
    return run


def resolved(given: dict[str, object], from_file: dict[str, object], left_out: Callable[[str], bool]) -> RunConfig:
    """The run: each flag ``given`` on the command line, else the file's value (already checked
    there, naming the file), else the default; a flag's value checked here, naming the flag."""
    sections = {}
    for name, section in SECTIONS.items():
        values = {}
        for f in fields(section):
            if f.name in from_file and left_out(f.name):
                values[f.name] = from_file[f.name]
            else:
                values[f.name] = given[f.name]
                check_value(f, flag(f), values[f.name])
        sections[name] = section(**with_old_spellings("train", section, values))
    return RunConfig(**sections)
