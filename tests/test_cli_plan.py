"""The planning commands through the real entry point, bad input included."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli


def test_list_shows_every_schedule_with_its_constraints():
    out = run_cli("list")
    assert out.returncode == 0, out.stderr
    for name in ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-v", "interleaved-zb"):
        assert name in out.stdout
    assert "chunks=2" in out.stdout


def test_simulate_json_has_the_contract_keys():
    out = run_cli("simulate", "zb-v", "--ranks", "4", "--microbatches", "8", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["span"] == 24 and data["makespan"] == 25.5
    assert data["peak_memory"] == [4, 4, 4, 4]
    assert set(data) >= {"makespan", "span", "bubble_ratio", "busy", "peak_memory"}


def test_export_then_simulate_the_csv(tmp_path):
    target = tmp_path / "zbh1.csv"
    out = run_cli("export", "zb-h1", "-p", "4", "-m", "8", "-o", str(target))
    assert out.returncode == 0, out.stderr
    out = run_cli("simulate", "--csv", str(target), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["makespan"] == 3 * 8 + 3


def test_a_dualpipe_csv_loads_back_as_its_two_pipelines_in_simulate_draw_and_train(tmp_path):
    target = tmp_path / "dp.csv"
    exported = run_cli("export", "dualpipe", "-p", "4", "-m", "8", "-o", str(target))
    assert exported.returncode == 0 and "placement=v pipelines=2" in exported.stderr
    loaded = run_cli("simulate", "--csv", str(target), "--json", "--costs", "1,1.5,0.5", "--comm", "0.1")
    built = run_cli("simulate", "dualpipe", "-p", "4", "-m", "8", "--json", "--costs", "1,1.5,0.5", "--comm", "0.1")
    assert loaded.returncode == 0, loaded.stderr
    assert {**json.loads(loaded.stdout), "schedule": "dualpipe"} == json.loads(built.stdout)  # "dp": the file's
    drawn = run_cli("draw", "--csv", str(target), "-o", str(tmp_path / "dp.svg"))
    assert drawn.returncode == 0 and "pipelines=2" in drawn.stderr, drawn.stderr
    # train loads and validates the CSV before it starts a process: its microbatch check answers
    trained = run_cli("train", "--csv", str(target), "--ranks", "4", "--microbatches", "6")
    assert trained.returncode == 2
    assert "dp.csv has 8 microbatches but --microbatches is 6" in trained.stderr


def test_a_two_pipeline_csv_that_no_split_explains_is_one_line_and_exit_2(tmp_path):
    rows = run_cli("export", "dualpipe", "-p", "2", "-m", "4").stdout.splitlines()
    assert rows[1].startswith("2F2,")  # rank 1 feeds the reverse copy: stages 2-3, microbatches 2-3
    path = tmp_path / "bad.csv"
    path.write_text(rows[0] + "\n" + rows[1].replace("2F2,", "2F1,", 1) + "\n")
    out = run_cli("simulate", "--csv", str(path))
    assert out.returncode == 2
    assert out.stderr.startswith("pipesched: error: the stages run different microbatches")
    assert "stages 0-1 run 0-1, stage 2 runs 1-3, stage 3 runs 2-3" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_export_to_stdout_is_the_csv():
    out = run_cli("export", "1f1b", "-p", "2", "-m", "2")
    assert out.stdout.splitlines() == ["0F0,0F1,0B0,0B1", "1F0,1B0,1F1,1B1"]


def test_compare_ranks_every_schedule_against_1f1b():
    out = run_cli("compare", "-p", "4", "-m", "8", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["schedule"]: r for r in json.loads(out.stdout)}
    assert rows["1f1b"]["speedup_vs_1f1b"] == 1.0
    assert rows["zb-v"]["speedup_vs_1f1b"] == pytest.approx(33 / 25.5)
    table = run_cli("compare", "-p", "4", "-m", "8", "--costs", "1,1.4,0.6", "--comm", "0.1")
    assert table.returncode == 0 and "interleaved-zb" in table.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["simulate", "zb-vv"], "unknown schedule 'zb-vv'; did you mean zb-v"),
        (["simulate", "1f1b", "--ranks", "0"], "--ranks must be at least 1"),
        (["simulate", "1f1b", "--microbatches", "0"], "--microbatches must be at least 1"),
        (["simulate", "zb-v", "--chunks", "3"], "zb-v needs chunks=2"),
        (["simulate", "1f1b", "--costs", "1,-1,1"], "cost B must be a finite number from 1e-06 to 1e+09, got -1.0"),
        (["simulate", "1f1b", "--costs", "1,2"], "expected three numbers"),
        (["simulate", "1f1b", "--memory-limit", "2", "-p", "4"], "1f1b needs 4 activations"),
        (["simulate"], "give a schedule name or --csv FILE"),
        (["export", "1f1b", "-o", "/no/such/dir/x.csv"], "does not exist"),
        (["export", "1f1b", "-o", "x.txt"], "suffix must be one of .csv"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    out = run_cli(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "content, message",
    [
        ("0F0,0B0\n1F0,1Z0\n", "row 2 (rank 1), cell 2"),
        ("0F0,0B0,0F1,0B1\n1F0,1F1,1B1,1B0\n", "schedule deadlocks: rank 0 waits at 0B0 for 1B0"),
    ],
)
def test_bad_csv_is_one_line_and_exit_2(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    out = run_cli("simulate", "--csv", str(path))
    assert out.returncode == 2
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_console_script_is_installed_and_runs():
    script = shutil.which("pipesched") or str(Path(sys.executable).parent / "pipesched")
    if not Path(script).exists():
        pytest.skip("pipesched is not installed as a console script in this environment")
    out = subprocess.run([script, "list"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "zb-v" in out.stdout


def test_api_raises_value_errors_with_the_same_message():
    import pipesched

    with pytest.raises(ValueError, match="unknown schedule"):
        pipesched.build_schedule("nope", ranks=2, microbatches=2)
    with pytest.raises(ValueError, match="ranks must be at least 1"):
        pipesched.build_schedule("1f1b", ranks=0, microbatches=2)
