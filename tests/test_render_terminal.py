"""The terminal view: one line per rank that fits the width, idle time visible."""

from __future__ import annotations

import pytest

import pipesched
from pipesched.render.terminal import IDLE, timeline_text
from conftest import run_cli


def rank_lines(text) -> list[str]:
    return [line for line in text.plain.splitlines() if line.startswith("rank")]


@pytest.mark.parametrize("name,p,m,width", [("zb-v", 4, 8, 100), ("1f1b", 16, 64, 120), ("interleaved-1f1b", 16, 64, 80)])
def test_rows_fit_the_width(name, p, m, width):
    text = timeline_text(pipesched.simulate(pipesched.build_schedule(name, p, m)), width)
    rows = rank_lines(text)
    assert len(rows) == p
    assert {len(row) for row in rows} == {width - 1}
    assert all(len(line) <= width for line in text.plain.splitlines())


def test_bubbles_show_as_idle_cells_in_proportion():
    result = pipesched.simulate(pipesched.build_schedule("1f1b", 4, 8))
    rows = rank_lines(timeline_text(result, 200))
    cells = sum(len(row) - len("rank  0 ") for row in rows)
    idle = sum(row.count(IDLE) for row in rows)
    assert idle / cells == pytest.approx(result.bubble_ratio, abs=0.03)


def test_zero_bubble_rank_has_no_idle_cells_in_steady_state():
    result = pipesched.simulate(pipesched.build_schedule("gpipe", 1, 4))
    assert IDLE not in rank_lines(timeline_text(result, 80))[0]


def test_simulate_draw_prints_the_timeline():
    done = run_cli("simulate", "zb-h1", "--ranks", "4", "--microbatches", "8", "--draw")
    assert done.returncode == 0, done.stderr
    assert "makespan" in done.stdout
    assert sum(line.startswith("rank  ") for line in done.stdout.splitlines()) == 4
    assert "weight grad" in done.stdout


def test_simulate_draw_and_json_do_not_mix():
    done = run_cli("simulate", "1f1b", "--draw", "--json")
    assert done.returncode == 2 and "--json" in done.stderr and done.stdout == ""
