"""Tables fitted to the terminal: no number or header is ever cut, whatever the width.

rich, given a table wider than the console, shrinks every column evenly at the end, cutting
numbers (``1.493e+…``, ``79…``) and headers. Here each column's width is worked out first:
a number column is as wide as its widest value, its header wrapped between words to that width
(never narrower than its longest word); a text column (``wrap``) may wrap between words, down to
its longest word. When even that is wider than the console, the least important columns
(highest ``drop``) are left out, one at a time, and the caption says which. Used by ``compare``,
``simulate``, ``list`` and ``advise``, on a terminal and when piped (rich's width is then
``COLUMNS``, else 80). A table that cannot fit even with every column that may go left out (a
very narrow console) is printed wider than the console, its lines uncut.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

if TYPE_CHECKING:  # rich loads when a table prints
    from rich.console import Console
    from rich.table import Table


@dataclass(frozen=True)
class Column:
    """One column: its header (and a ``short`` one for a narrow table), how it aligns, whether
    its text may wrap between words, and when it goes if the table is too wide (``drop``: 0
    never; the highest goes first)."""

    header: str
    justify: str = "right"
    wrap: bool = False
    drop: int = 0
    short: str = ""

    def header_at(self, width: int) -> str:
        """The header wrapped between words to ``width`` (the short one where a word is wider)."""
        header = self.header if _longest_word(self.header) <= width or not self.short else self.short
        return "\n".join(textwrap.wrap(header, width, break_long_words=False)) or header


BORDERS = 3  # per column: a space either side and one rule; plus one rule at the right edge


def fitted_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int, title: str = "",
                 caption: Optional[str] = None, styles: Optional[Sequence[Optional[str]]] = None) -> Table:
    """A rich Table of ``rows`` (cells as rich markup) that fits ``width`` columns uncut."""
    from rich.table import Table
    from rich.text import Text

    texts = [[Text.from_markup(cell) for cell in row] for row in rows]
    kept = list(range(len(columns)))
    least = [_least_width(columns[i], [r[i] for r in texts]) for i in kept]
    fits = [max([least[i]] + [r[i].cell_len for r in texts]) for i in kept]
    most = [max(fits[i], len(columns[i].header)) for i in kept]

    def total(indices: Sequence[int]) -> int:
        return sum(least[i] for i in indices) + BORDERS * len(indices) + 1

    dropped = []
    while total(kept) > width and any(columns[i].drop for i in kept):
        worst = max((i for i in kept if columns[i].drop), key=lambda i: (columns[i].drop, i))
        kept.remove(worst)
        dropped.append(columns[worst].header)
    widths = _share(kept, least, fits, most, width - BORDERS * len(kept) - 1)
    notes = [caption] if caption else []
    if dropped:
        notes.append(f"left out to fit {width} columns: {', '.join(dropped)} (a wider terminal or --json shows them)")
    needed = sum(widths.values()) + BORDERS * len(kept) + 1
    # wider than the console even so (a very narrow one): the lines run past it, never cut
    table = Table(title=title or None, caption="\n".join(notes) or None, width=needed if needed > width else None)
    for i in kept:
        c = columns[i]
        table.add_column(c.header_at(widths[i]), justify=c.justify, width=widths[i], no_wrap=not c.wrap, overflow="fold")
    for n, row in enumerate(texts):
        table.add_row(*(row[i] for i in kept), style=styles[n] if styles else None)
    return table


def print_table(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[str]], title: str = "",
                caption: Optional[str] = None, styles: Optional[Sequence[Optional[str]]] = None) -> None:
    """Print :func:`fitted_table` at the console's width (uncropped, should it be wider; laid out
    as on a terminal where the console keeps piped lines whole: render/console.py)."""
    console.print(fitted_table(columns, rows, console.width, title, caption, styles), crop=False, soft_wrap=False)


def _least_width(column: Column, cells: Sequence) -> int:
    """The narrowest the column may be: its (short) header's longest word, and its widest cell
    (a number) or longest word (text that wraps)."""
    header = _longest_word(column.short or column.header)
    if column.wrap:
        return max([header, 1] + [_longest_word(cell.plain) for cell in cells])
    return max([header, 1] + [cell.cell_len for cell in cells])


def _longest_word(text: str) -> int:
    return max((len(word) for word in text.split()), default=0)


def _share(kept: Sequence[int], least: Sequence[int], fits: Sequence[int], most: Sequence[int], room: int) -> dict:
    """Widths: every column its least; then the room left goes first to the text that would
    wrap (up to ``fits``, its widest cell), then to the headers (up to ``most``, on one line),
    each time in proportion to what each column still wants."""
    widths = {i: least[i] for i in kept}
    for goal in (fits, most):
        spare = room - sum(widths.values())
        want = {i: max(0, goal[i] - widths[i]) for i in kept}
        total = sum(want.values())
        if spare <= 0 or not total:
            continue
        for i in kept:
            widths[i] += want[i] if spare >= total else math.floor(spare * want[i] / total)
    return widths
