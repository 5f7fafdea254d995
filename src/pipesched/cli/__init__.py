"""The ``pipesched`` command line: one sub-command per module, errors as one line and exit 2."""

from __future__ import annotations

import sys

import typer

from ..errors import PipeschedError

app = typer.Typer(
    name="pipesched",
    help="Pipeline-parallel schedules: build, simulate, compare, draw, choose and run them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_commands() -> None:
    from . import plan  # noqa: F401  (list, export, simulate, compare)
    from . import draw  # noqa: F401  (draw, report)
    from . import train  # noqa: F401  (train; imports torch only when run)
    from . import advise  # noqa: F401  (advise)
    from . import demo  # noqa: F401  (demo: the tour)


def fail(message: str) -> "typer.Exit":
    """Print one line on stderr and return the exit (status 2) for the caller to raise."""
    typer.echo(f"pipesched: error: {message}", err=True)
    return typer.Exit(code=2)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    _register_commands()
    try:
        status = app(args=argv, prog_name="pipesched", standalone_mode=False)
    except PipeschedError as err:
        typer.echo(f"pipesched: error: {err}", err=True)
        sys.exit(2)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except typer.Abort:
        typer.echo("pipesched: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        typer.echo("pipesched: interrupted", err=True)
        sys.exit(130)
    except Exception as err:  # click usage errors and friends
        import click

        if isinstance(err, click.ClickException):
            typer.echo(f"pipesched: error: {err.format_message()}", err=True)
            sys.exit(err.exit_code)
        raise
    # click returns a raised typer.Exit's code instead of exiting when standalone_mode is off
    sys.exit(status if isinstance(status, int) else 0)
