"""Generated input through pipesched's entry point (issue 22): extreme values of every numeric
option of simulate, export, draw, compare and advise, and generated schedule CSVs. Every case is
refused in one line with exit status 2, or accepted with strict JSON; none raises, prints a
traceback or a long message, or runs past its bound (:mod:`fuzz_cases`).

Deterministic (derandomised, no example database) and bounded: a few batches of cases, each
batch one subprocess that imports pipesched once. No shrinking: a failure lists every case of
its batch that went wrong, already small. The wider run behind benchmarks/RESULTS.md is
``benchmarks/fuzz.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from conftest import cli_env
from fuzz_cases import csv_case, csv_cases, option_case, problems, run_batch

SCRIPT = Path(sys.executable).with_name("pipesched")
FUZZ = settings(max_examples=2, derandomize=True, deadline=None, database=None, phases=[Phase.generate],
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


@FUZZ
@given(cases=st.lists(option_case(), min_size=30, max_size=30))
def test_extreme_option_values_are_refused_in_one_line_or_run_within_bounds(tmp_path, cases):
    outcomes = run_batch(cases, tmp_path)
    failures = [p for o in outcomes for p in problems(o)]
    assert not failures, "\n".join(failures)
    assert sum(o.code == 2 for o in outcomes) >= len(cases) // 2  # most extremes are refused


@FUZZ
@given(files=st.lists(csv_case(), min_size=40, max_size=40))
def test_generated_csvs_are_refused_in_one_line_or_simulated(tmp_path, files):
    outcomes = run_batch(csv_cases(files, tmp_path), tmp_path)
    failures = [p for o in outcomes for p in problems(o)]
    assert not failures, "\n".join(failures)


def test_the_batch_runner_sees_what_the_console_script_does(tmp_path):
    # the same refusals through the installed script, process by process, for a few cases
    cases = [["simulate", "1f1b", "--comm=1e308"], ["advise", "-p", "2", "-m", "4", "--workers=0"],
             ["simulate", "1f1b", "-p", "nan"]]
    batch = run_batch(cases, tmp_path)
    for argv, outcome in zip(cases, batch):
        alone = subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, env=cli_env(), cwd=tmp_path, timeout=60)
        assert (alone.returncode, alone.stderr) == (outcome.code, outcome.stderr) == (2, alone.stderr)
        assert not problems(outcome)
