"""The action grammar and torch's compute-only CSV: print, parse, round-trip, golden files."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipesched
from pipesched import Action, CSVFormatError, Schedule, build_schedule

GOLDEN = Path(__file__).parent / "golden"


def test_actions_print_and_parse_in_torch_grammar():
    assert str(Action(2, "F", 0)) == "2F0"
    assert str(Action(1, "I", 3)) == "1I3"
    assert Action.parse("0W2") == Action(0, "W", 2)
    assert Action.parse(" 13B11 ") == Action(13, "B", 11)


@pytest.mark.parametrize("text", ["", "F0", "2X0", "2F", "2SEND_F0", "-1F0", "2F0x"])
def test_bad_action_strings_are_refused_with_the_grammar(text):
    with pytest.raises(CSVFormatError, match="<stage><kind><microbatch>"):
        Action.parse(text)


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.csv")), ids=lambda p: p.stem)
def test_generators_reproduce_golden_csvs(path):
    name, p, m = path.stem.rsplit("-", 2)
    schedule = build_schedule(name, ranks=int(p[1:]), microbatches=int(m[1:]))
    assert schedule.to_csv() == path.read_bytes().decode()


@pytest.mark.parametrize("name", pipesched.schedule_names())
@settings(max_examples=10, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12))
def test_csv_round_trips_exactly(name, p, m):
    if name == "dualpipe":  # even ranks only
        p, m = p + p % 2, max(m, 2)
    schedule = build_schedule(name, ranks=p, microbatches=m)
    text = schedule.to_csv()
    back = Schedule.from_csv(text)
    assert back.to_csv() == text
    assert back.orders == schedule.orders
    assert back.placement == schedule.placement
    assert back.microbatches == m
    assert back.pipelines == schedule.pipelines  # read from which microbatches each stage runs


def test_idle_slots_survive_a_round_trip():
    text = "0F0,,0B0\r\n,1F0,1B0\r\n"
    schedule = Schedule.from_csv(text)
    assert schedule.orders[0][1] is None
    assert schedule.to_csv() == text
    pipesched.validate(schedule)


def test_placement_is_inferred_from_rows():
    schedule = Schedule.from_csv(build_schedule("zb-v", ranks=3, microbatches=6).to_csv())
    assert schedule.placement == (0, 1, 2, 2, 1, 0)
    assert schedule.style == "v"


def test_unix_line_endings_are_accepted():
    schedule = Schedule.from_csv("0F0,0B0\n1F0,1B0\n")
    assert schedule.ranks == 2


def test_malformed_cell_names_row_and_cell():
    with pytest.raises(CSVFormatError, match=r"row 2 \(rank 1\), cell 3"):
        Schedule.from_csv("0F0,0B0\n1F0,1B0,1Q0\n")


def test_stage_on_two_rows_is_refused():
    with pytest.raises(CSVFormatError, match="stage 0 appears on rank 0 and on rank 1"):
        Schedule.from_csv("0F0,0B0\n0F1,0B1\n")


def test_empty_csv_is_refused():
    with pytest.raises(CSVFormatError, match="empty"):
        Schedule.from_csv("\n\n")
