"""The ``pipesched`` command line: one sub-command per module, errors as one line and exit 2."""

from __future__ import annotations

import sys

import typer
from typer.core import TyperGroup

from ..errors import PipeschedError


class _Commands(TyperGroup):
    """The command group: a command stopped by Ctrl-C says so (typer alone exits 130 silently)."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:
            raise interrupted() from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise interrupted() from None


app = typer.Typer(
    cls=_Commands,
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
    from . import checkpoint  # noqa: F401  (checkpoint verify)


def fail(message: str) -> "typer.Exit":
    """Print one line on stderr and return the exit (status 2) for the caller to raise."""
    typer.echo(f"pipesched: error: {message}", err=True)
    return typer.Exit(code=2)


def interrupted() -> "typer.Exit":
    """Say in one line that Ctrl-C stopped the command; return the exit (status 130) to raise."""
    typer.echo("pipesched: interrupted", err=True)
    return typer.Exit(code=130)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        _register_commands()
        status = app(args=argv, prog_name="pipesched", standalone_mode=False)
    except PipeschedError as err:
        typer.echo(f"pipesched: error: {bounded(str(err))}", err=True)
        sys.exit(2)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except typer.Abort:
        typer.echo("pipesched: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:  # before any command runs (while the commands load)
        sys.exit(interrupted().exit_code)
    except ClickException as err:  # usage errors (bad option values, unknown options, ...)
        sys.exit(report_click_error(err))
    # click returns a raised typer.Exit's code instead of exiting when standalone_mode is off
    sys.exit(status if isinstance(status, int) else 0)


# typer.BadParameter is click's BadParameter, from whichever click typer uses: its own copy since
# typer 0.2x, the click package before. Its bases are that click's UsageError and ClickException
# (importing ``click`` itself fails where typer vendors it).
_CLICK = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
ClickException: type[Exception] = _CLICK["ClickException"]
UsageError: type[Exception] = _CLICK["UsageError"]


def report_click_error(err: Exception) -> int:
    """Print a click error as click words it, without a traceback; return its exit status.

    A usage error shows the command's usage line and where to find help, then one line
    ``pipesched: error: MESSAGE`` (click's message, the prefix every pipesched error has).
    ``pipesched`` alone prints the help (click's NoArgsIsHelpError, exit status 2).
    """
    if type(err).__name__ == "NoArgsIsHelpError":
        err.show()
        return err.exit_code
    ctx = getattr(err, "ctx", None) if isinstance(err, UsageError) else None
    if ctx is not None:
        typer.echo(ctx.get_usage(), err=True)
        typer.echo(f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help.", err=True)
    message = " ".join(err.format_message().split())
    typer.echo(f"pipesched: error: {bounded(message)}", err=True)
    return err.exit_code


MAX_MESSAGE = 1500  # characters of an error line: a pasted file or a 5,000-digit value is cut


def bounded(message: str) -> str:
    """``message`` on one line of at most about MAX_MESSAGE characters, cut in the middle."""
    line = " ".join(message.split()) if "\n" in message else message
    if len(line) <= MAX_MESSAGE:
        return line
    half = MAX_MESSAGE // 2
    return f"{line[:half]} [... {len(line) - 2 * half} characters ...] {line[-half:]}"
