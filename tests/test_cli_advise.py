"""``pipesched advise`` through the real entry point."""

from __future__ import annotations

import json

import pytest

from pipesched import Costs, build_schedule, schedule_names, simulate

# Every family but zb-auto, whose time-limited exact refinement takes seconds per build.
FAST = ",".join(n for n in schedule_names() if n != "zb-auto")


def test_json_lists_candidates_best_first_and_each_rebuilds(cli):
    out = cli("advise", "--ranks", "4", "--memory-limit", "4", "--microbatches", "8",
              "--costs", "1,1.4,0.6", "--comm", "0.1", "--json", "--schedules", FAST)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    for key in ("schedule", "chunks", "microbatches", "memory_limit", "makespan", "span",
                "bubble_ratio", "peak_memory", "fits"):
        assert key in rows[0]
    fitting = [r for r in rows if r["fits"]]
    assert rows[0]["makespan"] == pytest.approx(min(r["makespan"] for r in fitting))
    best = rows[0]
    costs = Costs(**{k: v for k, v in best["costs"].items() if k != "stage_multipliers"})
    again = simulate(build_schedule(best["schedule"], 4, best["microbatches"], best["chunks"], costs,
                                    best["memory_limit"]), costs)
    assert again.makespan == pytest.approx(best["makespan"])


def test_table_shows_the_recommendation_and_why(cli):
    out = cli("advise", "--ranks", "4", "--memory-limit", "4", "--microbatches", "4", "--schedules", FAST)
    assert out.returncode == 0, out.stderr
    assert "Recommendation:" in out.stdout and "vs 1f1b" in out.stdout
    assert "never fills" in out.stdout
    assert "pipesched export" in out.stdout


def test_model_description_gives_layers_per_stage(cli):
    out = cli("advise", "--ranks", "4", "--layers", "14", "--hidden", "1024", "--seq-len", "1024",
              "--microbatch-size", "2", "--vocab", "50000", "--global-batch", "32",
              "--gpu-memory", "40", "--bandwidth", "20", "--schedules", FAST)
    assert out.returncode == 0, out.stderr
    assert "Layers per stage" in out.stdout and "GB" in out.stdout
    assert "--stage-blocks" in out.stdout  # the split as blocks (embedding, head one each), as train takes it


@pytest.mark.parametrize("args,message", [
    (["--memory-limit", "0.5", "--microbatches", "8"], "smallest feasible limit is"),
    (["--microbatches", "8", "--schedules", "1f1b,zb-h9"], "unknown schedule 'zb-h9'"),
    (["--global-batch", "10", "--microbatch-size", "3"], "not divisible by microbatch size 3"),
    (["--layers", "12", "--microbatch-size", "2", "--microbatches", "8"], "missing --hidden, --seq-len"),
    (["--gpu-memory", "80", "--microbatches", "8"], "missing --layers"),
    (["--layers", "12", "--hidden", "64", "--seq-len", "32", "--microbatch-size", "2",
      "--microbatches", "8", "--costs", "1,1,1"], "--costs cannot be combined"),
    (["--microbatches", "8", "--objective", "fast"], "objective must be one of"),
])
def test_bad_input_is_one_line_and_exit_2(cli, args, message):
    out = cli("advise", "--ranks", "4", *args, *([] if "--schedules" in args else ["--schedules", FAST]))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in out.stderr


def test_html_report_carries_the_advice(cli, tmp_path):
    out = cli("report", "--ranks", "4", "--microbatches", "8", "--memory-limit", "4", "-o", str(tmp_path / "r.html"))
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "r.html").read_text()
    assert "Which schedule to choose" in page and "Recommendation:" in page and "<table>" in page


MODEL = ["--layers", "8", "--hidden", "1024", "--seq-len", "512", "--microbatch-size", "2", "--global-batch", "32"]
IGNORED = [  # (arguments, the mode named, the flag named): each flag does nothing in that mode
    (["--profile", "-m", "4", "--overhead", "0.1"], "--profile", "--overhead"),
    (["--profile", "-m", "4", "--microbatch-size", "2"], "--profile", "--microbatch-size"),
    (["--profile", "-m", "4", "--max-microbatches", "16"], "--profile", "--max-microbatches"),
    (["--profile", "-m", "4", "--min-microbatch-size", "2"], "--profile", "--min-microbatch-size"),
    (["--gpus", "4", *MODEL, "--bandwidth", "50", "--microbatches", "8"], "--gpus", "--microbatches"),
    (["--gpus", "4", *MODEL, "--bandwidth", "50", "--overhead", "0.1"], "--gpus", "--overhead"),
    ([*MODEL, "--overhead", "0.1"], "a model description", "--overhead"),
    (["-m", "8", "--model", "gpt"], "given costs", "--model"),
    (["-m", "8", "--dp-latency", "1"], "given costs", "--dp-latency"),
]


def test_a_flag_the_mode_ignores_is_refused_in_one_line_naming_the_mode():
    from conftest import concurrently, run_cli

    outs = concurrently(lambda row: run_cli("advise", "--ranks", "2", *row[0]), IGNORED)
    for (args, mode, flag), out in zip(IGNORED, outs):
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, (args, out.stderr)
        assert f"advise with {mode} ignores {flag}" in lines[0] and "Traceback" not in out.stderr


def test_the_old_spellings_still_work_for_a_release_with_a_one_line_warning(cli, tmp_path):
    from conftest import concurrently, run_cli

    rows = [
        ("advise", "--ranks", "2", *MODEL, "--dtype", "fp32", "--schedules", "1f1b", "--json"),
        ("advise", "--ranks", "2", *MODEL, "--activation-dtype", "fp32", "--schedules", "1f1b", "--json"),
        ("train", "--model", "mlp", "--json", str(tmp_path / "run.txt")),  # refused for its suffix, torch unloaded
    ]
    old, new, train = concurrently(lambda row: run_cli(*row), rows)
    assert old.returncode == 0 and json.loads(old.stdout) == json.loads(new.stdout)
    assert old.stderr.strip() == "pipesched: warning: advise --dtype is deprecated and goes in the next release: use --activation-dtype"
    assert train.returncode == 2
    warning, error = train.stderr.strip().splitlines()
    assert "train --json is deprecated" in warning and "use --summary" in warning and ".json" in error
