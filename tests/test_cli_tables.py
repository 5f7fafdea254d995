"""Tables at 80 columns with stdout a pipe (what ``| cat`` or a narrow pane gives): through the
console script, no number or header is cut, times carry units, and a column left out is named."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import cli_env, concurrently
from pipesched.units import format_number, format_seconds, format_time

MODEL = ["--layers", "8", "--hidden", "1024", "--seq-len", "512", "--vocab", "32000", "--microbatch-size", "2",
         "--global-batch", "32", "--gpu-memory", "40", "--bandwidth", "50"]
BOX = "┏┃┡│└┗┣┠╇┩"  # the characters a table's lines start with


def run_at_80(*args: str) -> subprocess.CompletedProcess:
    env = {**cli_env(), "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "pipesched", *args], capture_output=True, text=True, env=env, timeout=300)


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line[:1] in BOX]


def cells(text: str) -> list[list[str]]:
    """The table's rows as cells (rows of one line each)."""
    return [[c.strip() for c in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]


def check_uncut(out: subprocess.CompletedProcess) -> None:
    assert out.returncode == 0, out.stderr
    assert "…" not in out.stdout, out.stdout
    assert table_lines(out.stdout) and all(len(line) <= 80 for line in table_lines(out.stdout)), out.stdout


COMMANDS = {
    "list": ["list"],
    "simulate": ["simulate", "zb-v", "-p", "8", "-m", "4000"],
    "compare": ["compare", "-p", "8", "-m", "32", "--costs", "1,1.4,0.6", "--comm", "0.1", "--memory-limit", "6"],
    "compare json": ["compare", "-p", "8", "-m", "32", "--costs", "1,1.4,0.6", "--comm", "0.1", "--memory-limit", "6", "--json"],
    "advise costs": ["advise", "-p", "4", "--global-batch", "64", "--microbatch-size", "4", "--costs", "1000,1400,600",
                     "--memory-limit", "4", "--schedules", "1f1b,zb-h1,zb-v,interleaved-zb"],
    "advise model": ["advise", "-p", "4", *MODEL, "--schedules", "1f1b,zb-h1,zb-v,interleaved-zb"],
    "advise model json": ["advise", "-p", "4", *MODEL, "--schedules", "1f1b,zb-h1,zb-v,interleaved-zb", "--json"],
    "advise gpus": ["advise", "--gpus", "4", *MODEL, "--schedules", "1f1b,zb-h1,zb-v"],
    "advise gpus json": ["advise", "--gpus", "4", *MODEL, "--schedules", "1f1b,zb-h1,zb-v", "--json"],
}


@pytest.fixture(scope="module")
def outputs():
    names = list(COMMANDS)
    return dict(zip(names, concurrently(lambda name: run_at_80(*COMMANDS[name]), names)))


@pytest.mark.parametrize("name", [n for n in COMMANDS if not n.endswith("json")])
def test_no_number_or_header_is_cut_at_80_columns_when_piped(outputs, name):
    check_uncut(outputs[name])


def test_list_wraps_its_descriptions_and_names_the_column_it_leaves_out(outputs):
    text = outputs["list"].stdout
    for name in ("gpipe", "interleaved-1f1b", "dualpipev"):
        assert any(row[0] == name for row in cells(text))
    assert "left out to fit 80 columns: backward" in text


def test_compare_shows_every_makespan_whole_and_says_which_columns_it_left_out(outputs):
    rows = json.loads(outputs["compare json"].stdout)
    shown = {row[0]: row for row in cells(outputs["compare"].stdout) if row[0]}
    for row in rows:
        if "error" in row:
            assert f"{row['schedule']} (chunks={row['chunks']}): not built" in outputs["compare"].stdout
        elif row["schedule"] == "zb-auto":  # a time-bounded search: two runs may end on different plans
            assert any(re.fullmatch(r"\d+(\.\d+)?", cell) for cell in shown["zb-auto"])
        else:
            assert format_number(row["makespan"]) in shown[row["schedule"]]
    assert "left out to fit 80 columns: per rank" in outputs["compare"].stdout


def test_piped_sentences_stay_whole_while_the_tables_fit_80_columns(outputs):
    """Off a terminal rich wrapped every line at 80 columns, a recommendation or a refusal cut
    mid-phrase for whatever reads the pipe. Only the tables fit the width (the tests above); each
    printed sentence is one line (render/console.py, which train's summary uses too)."""
    for name in ("advise costs", "advise model", "advise gpus"):
        lines = outputs[name].stdout.splitlines()
        said = [i for i, line in enumerate(lines) if line.startswith("Recommendation: ")]
        assert len(said) == 1 and len(lines[said[0]]) > 80, outputs[name].stdout  # whole, and longer than 80
        assert lines[said[0] + 1].startswith("  "), outputs[name].stdout  # its first note next, not its rest
    compared = outputs["compare"].stdout.splitlines()
    failed = [row for row in json.loads(outputs["compare json"].stdout) if "error" in row]
    assert failed and all(len(row["error"]) > 80 for row in failed)
    for row in failed:
        assert f"  {row['schedule']} (chunks={row['chunks']}): not built: {row['error']}" in compared


def test_simulate_writes_large_values_without_an_exponent(outputs):
    text = outputs["simulate"].stdout
    assert "e+" not in text and re.search(r"makespan \d{5,} ", text)


def test_advise_times_carry_units_and_whole_numbers(outputs):
    rows = json.loads(outputs["advise model json"].stdout)
    best = cells(outputs["advise model"].stdout)[0]
    assert format_time(rows[0]["makespan"], "ms") in best and re.search(r"\d (ms|s)$", format_time(rows[0]["makespan"], "ms"))
    assert f"{rows[0]['memory_gb']:.1f}" in best  # GB in all: the same bytes as peak_memory_bytes
    assert rows[0]["peak_memory_bytes_counts"].startswith("weights, gradients, optimizer state")
    costs = cells(outputs["advise costs"].stdout)[0]
    assert all("e+" not in c for c in costs)  # cost units: a plain number, however large


def test_advise_gpus_lists_every_layout_searched_and_times_in_units(outputs):
    text = outputs["advise gpus"].stdout
    assert re.search(r"Layouts searched: pp=1 x dp=4: .*pp=2 x dp=2: .*pp=4 x dp=1: ", " ".join(text.split()))
    entries = json.loads(outputs["advise gpus json"].stdout)
    assert format_time(entries[0]["step_time"], "ms") in cells(text)[0] and all(e["searched"] for e in entries)


def test_durations_pick_the_unit_that_fits():
    assert [format_seconds(x) for x in (0.812, 14.93, 59.96, 200, 7200)] == ["812 ms", "14.9 s", "60 s", "3.3 min", "2 h"]
    assert [format_number(x) for x in (14930.2, 1567.5, 0.1234)] == ["14930", "1568", "0.1234"]


def test_a_console_too_narrow_for_any_table_gets_it_wider_than_itself_but_uncut():
    env = {**cli_env(), "COLUMNS": "30"}
    out = subprocess.run([sys.executable, "-m", "pipesched", "compare", "-p", "4", "-m", "8"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and "…" not in out.stdout
    assert any(row[0] == "interleaved-1f1b" and row[2] == "28.5" for row in cells(out.stdout))
