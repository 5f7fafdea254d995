"""The console a command prints its results on (train's summary, advise's advice, the tables and
lines of list, simulate and compare).

On a terminal it is rich's own: text wraps at the terminal's width. Piped or redirected, rich
would wrap at 80 columns (or ``$COLUMNS``) and cut a recommendation or a summary line
mid-phrase for the program or file that reads it (grep, a log); there the console keeps each
printed line whole (``soft_wrap``). Its width still fits the tables (their columns fold or drop
to it, cli/tables.py), so a table piped through ``| cat`` stays as narrow as before.
"""

from __future__ import annotations

from rich.console import Console


def output_console() -> Console:
    """stdout's console: rich's on a terminal; off one, every printed line kept whole."""
    console = Console()
    return console if console.is_terminal else Console(soft_wrap=True)
