"""``advise --gpus``'s progress line (issue 37 item 3): layouts done of all and the time elapsed,
on stderr, every few seconds on a terminal and only once the search runs long elsewhere; the
JSON on stdout never carries it (tests/test_advise_experts.py parses a search's whole stdout)."""

from __future__ import annotations

import io

import pipesched.cli.progress as progress
from pipesched.cli.progress import LAYOUT_LINE_EVERY, LAYOUT_LINE_LONG, LayoutProgress


class Stream(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


def _lines(monkeypatch, terminal: bool, times: list[float], total: int = 10) -> list[str]:
    clock = iter([0.0] + times)
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    stream = Stream(terminal)
    report = LayoutProgress(stream)
    for done, _ in enumerate(times, 1):
        report(done, total)
    return stream.getvalue().splitlines()


def test_off_a_terminal_a_line_only_once_the_search_runs_long(monkeypatch):
    short = [LAYOUT_LINE_LONG / 3, LAYOUT_LINE_LONG / 2]
    assert _lines(monkeypatch, False, short) == []
    lines = _lines(monkeypatch, False, short + [LAYOUT_LINE_LONG + 1, LAYOUT_LINE_LONG + 2])
    assert lines == ["pipesched advise: 3 of 10 layouts done, 31 s elapsed"]  # then not again within 30 s


def test_on_a_terminal_every_few_seconds_and_never_after_the_last_layout(monkeypatch):
    times = [LAYOUT_LINE_EVERY + 1, LAYOUT_LINE_EVERY + 2, 2 * LAYOUT_LINE_EVERY + 2, 3 * LAYOUT_LINE_EVERY + 3]
    lines = _lines(monkeypatch, True, times, total=4)
    assert lines == ["pipesched advise: 1 of 4 layouts done, 6 s elapsed",
                     "pipesched advise: 3 of 4 layouts done, 12 s elapsed"]
