"""A group of a command's options given to it as one dataclass (``pipesched advise``'s search options).

typer reads a command's options from its signature; :func:`option_group` puts a group's options
in the place of one parameter (say ``search: SearchFlags``) and hands the command the dataclass of
their values, so the command's own signature stays short and the group is declared, checked and
documented in its own module.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import fields
from typing import Callable


def option_group(param: str, flags_type: type, declared: tuple[tuple[str, object, object], ...]) -> Callable[[Callable], Callable]:
    """Give a typer command the options ``declared`` ((field, type, typer's declaration), fields
    of the dataclass ``flags_type`` in --help's order; a field left out keeps its default) in
    place of its parameter ``param``."""
    assert {name for name, _, _ in declared} <= {f.name for f in fields(flags_type)}

    def decorate(command: Callable) -> Callable:
        own = inspect.signature(command, eval_str=True).parameters
        group = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=declaration, annotation=kind)
                 for name, kind, declaration in declared]
        params: list[inspect.Parameter] = []
        for p in own.values():
            params.extend(group if p.name == param else [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)])
        names = {p.name for p in group}

        @functools.wraps(command)
        def run(**given):
            flags = flags_type(**{name: given.pop(name) for name in list(given) if name in names})
            return command(**{param: flags}, **given)

        run.__signature__ = inspect.Signature(params, return_annotation=None)
        run.__annotations__ = {p.name: p.annotation for p in params}
        del run.__wrapped__  # typer reads the signature above, not the command's
        return run

    return decorate
