"""The metrics of each logging interval, in one process (the reference run): intervals of
``--log-every`` steps with their mean loss and last rate, JSON lines, plain progress lines when
not on a terminal, the MFU from the model's FLOPs per token and a given peak."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env

torch = pytest.importorskip("torch")

from pipesched.training.loop_options import LoopOptions  # noqa: E402
from pipesched.training.model_flops import flops_per_token, parameter_count  # noqa: E402
from pipesched.training.models import get_model  # noqa: E402
from pipesched.training.train import TrainConfig, train_reference  # noqa: E402

pytestmark = pytest.mark.torch

GPT = {"layers": 2, "dim": 32, "heads": 2, "context": 16}


def test_each_interval_logs_its_mean_loss_last_rate_throughput_and_mfu(tmp_path, capsys):
    path = tmp_path / "run.jsonl"
    loop = LoopOptions(lr_schedule="linear", warmup=1, log_every=2, metrics_path=str(path), peak_tflops=1e-3)
    cfg = TrainConfig("gpt", None, 5, 4, model_size=GPT, loop=loop, show_progress=True)
    result = train_reference(cfg)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == result.loop.metrics  # --metrics makes every figure measured (the gradient norm too)
    assert [r["step"] for r in rows] == [2, 4, 5]  # every 2 steps, and the last
    losses, rates = result.losses, result.loop.lrs
    assert [r["loss"] for r in rows] == pytest.approx([sum(losses[0:2]) / 2, sum(losses[2:4]) / 2, losses[4]], rel=1e-15)
    assert [r["lr"] for r in rows] == [rates[1], rates[3], rates[4]]
    flops = flops_per_token(get_model("gpt", **GPT), GPT["context"])
    for row, times in zip(rows, (result.step_times[0:2], result.step_times[2:4], result.step_times[4:])):
        assert row["tokens_per_s"] == pytest.approx(4 * GPT["context"] * len(times) / sum(times), rel=1e-12)
        assert row["mfu"] == pytest.approx(row["tokens_per_s"] * flops / 1e9, rel=1e-12)  # one device, 1e-3 TFLOP/s
        assert row["grad_norm"] > 0 and len(row["peak_memory_bytes"]) == 1
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("reference step")]
    assert [line.split()[2] for line in printed] == ["2/5", "4/5", "5/5"]  # piped: one plain line an interval
    assert all(" eta " in line and " tok/s" in line for line in printed)


def test_flops_per_token_counts_a_tied_weight_once_and_the_attention_term(tmp_path):
    pytest.importorskip("transformers")
    from hf_cases import make_config, make_model

    config = make_config("gpt2")
    config.to_json_file(str(tmp_path / "gpt2.json"))
    md = get_model(f"hf:{tmp_path / 'gpt2.json'}")
    whole = make_model("gpt2", dtype=torch.float32)
    n = sum(p.numel() for p in whole.parameters())  # named_parameters yields a tied weight once
    assert parameter_count(md) == n
    assert flops_per_token(md, 16) == 6 * n + 12 * config.n_layer * config.n_embd * 16


# ---- hostile outputs and metrics files, through the installed console script (issue 39): each
# refused in one line, exit 2, no traceback, in bounded time, before any rank starts

PIPESCHED = Path(sys.executable).with_name("pipesched")
ROW = {"step": 1, "loss": 1.5, "lr": 0.001, "tokens_per_s": 100.0, "step_time_s": 0.1, "peak_memory_bytes": [1024]}


def _command(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(PIPESCHED), *args], capture_output=True, text=True, timeout=timeout,
                          env={**cli_env(), **(env or {})})


def _refusal(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def _metrics_files(folder: Path) -> dict[str, str]:
    """Files ``report --run`` is given, by label, each beside the line it must refuse it with."""
    os.mkfifo(folder / "fifo.jsonl")  # nobody writes it: reading it would wait for ever
    with open(folder / "huge.jsonl", "wb") as fh:  # sparse: 300 MiB of NUL bytes on no disk
        fh.truncate(300 << 20)
    rows = {"string loss": {**ROW, "loss": "1.5"}, "400 digits": {**ROW, "lr": 10**399},
            "NaN evaluation": {**ROW, "eval_step": 1, "eval_loss": float("nan"), "eval_perplexity": None},
            "step true": {**ROW, "step": True}, "memory a string": {**ROW, "peak_memory_bytes": "1 GiB"},
            "bubble alone": {**ROW, "bubble_share": 0.2}}
    for label, row in rows.items():
        (folder / f"{label}.jsonl").write_text(json.dumps(row) + "\n")
    (folder / "nested.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    return {
        "fifo.jsonl": "not a regular file (a metrics file of pipesched train is one)",
        "/dev/zero": "not a regular file (a metrics file of pipesched train is one)",
        "huge.jsonl": "larger than 256 MiB, more than a metrics file of pipesched train holds",
        "string loss.jsonl": 'line 1: loss must be a finite number or null, got "1.5"',
        "400 digits.jsonl": "line 1: lr must be a finite number, got an integer of 400 digits",
        "NaN evaluation.jsonl": "line 1: eval_loss must be a finite number, got NaN",
        "step true.jsonl": "line 1: step must be a whole number from 1 to 9007199254740992, got true",
        "memory a string.jsonl": "line 1: peak_memory_bytes must be a list of at most 65536 whole numbers of bytes "
                                 '(one a rank), got "1 GiB"',
        "nested.jsonl": "line 1 is not a metrics line of pipesched train (nested or sized beyond one)",
        "bubble alone.jsonl": "line 1: bubble_share, simulated_bubble_share go together (only bubble_share given)",
    }


def test_report_run_refuses_what_is_not_a_metrics_file_in_one_line_and_bounded_time(tmp_path):
    from conftest import concurrently

    cases = _metrics_files(tmp_path)
    paths = [name if name.startswith("/") else str(tmp_path / name) for name in cases]
    done = concurrently(lambda path: _command("report", "--run", path, "-o", str(tmp_path / "r.html"), timeout=30), paths)
    for path, said, result in zip(paths, cases.values(), done):
        assert _refusal(result) == f"pipesched: error: --run {path!r}: {said}"
    assert not (tmp_path / "r.html").exists()


def test_train_refuses_a_fifo_metrics_file_and_a_tensorboard_folder_that_takes_no_files(tmp_path):
    from conftest import concurrently

    os.mkfifo(tmp_path / "fifo.jsonl")
    run = ["train", "--model", "mlp", "--ranks", "2", "--steps", "2"]
    fifo, proc = concurrently(lambda extra: _command(*run, *extra), [["--metrics", str(tmp_path / "fifo.jsonl")],
                                                                     ["--tensorboard", "/proc/pipesched-tb"]])
    assert _refusal(fifo) == (f"pipesched: error: cannot write {str(tmp_path / 'fifo.jsonl')!r}: it exists and is not a "
                              "regular file (a FIFO, a device, a socket)")
    assert _refusal(proc) == ("pipesched: error: cannot write into '/proc/pipesched-tb': folder '/proc' does not accept "
                              "new files (No such file or directory)")


def test_tensorboard_on_a_full_disk_is_one_warning_and_the_run_goes_on(tmp_path):
    """The disk fills after TensorBoard's first record: its writer thread fails. The run says so
    once, on stderr, and ends as it would have (exit 0, every metrics line written)."""
    pytest.importorskip("tensorboard")
    hooks = Path(__file__).resolve().parent / "fault_hooks"
    env = {"PYTHONPATH": os.pathsep.join([str(hooks), cli_env()["PYTHONPATH"]]), "PIPESCHED_TEST_FULL_DISK_TENSORBOARD": "1"}
    done = _command("train", "--model", "mlp", "-s", "none", "--steps", "3", "--batch-size", "8", "--tensorboard",
                    str(tmp_path / "tb"), "--metrics", str(tmp_path / "m.jsonl"), env=env, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"pipesched: warning: --tensorboard {str(tmp_path / 'tb')!r}: could not write (No space left on device); "
        "the run goes on without its TensorBoard scalars (--metrics keeps every figure)"]
    assert [json.loads(line)["step"] for line in (tmp_path / "m.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_the_progress_bar_shows_the_rate_and_the_latest_held_out_loss():
    from rich.console import Console

    from pipesched.training.progress_display import ProgressDisplay

    display = ProgressDisplay(3, "zb-v", terminal=True)
    try:
        display.step(2.0, 0.001, 0.1, False, eval_loss=2.5)
        display.step(1.75, 0.0005, 0.1, False)  # no evaluation this step: the latest one stays
        console = Console(record=True, width=200, file=open(os.devnull, "w"))
        console.print(display.bar.get_renderable())
    finally:
        display.close()
    shown = console.export_text()
    assert "loss 1.75000" in shown and "lr 0.0005" in shown and "eval loss 2.50000" in shown


def test_a_resumed_run_sets_aside_the_interrupted_runs_later_lines_and_a_half_written_one(tmp_path):
    from pipesched.training.report.metrics_file import continue_after, read_metrics

    path = tmp_path / "m.jsonl"
    lines = [json.dumps({**ROW, "step": step, "elapsed_s": 0.5 * step}) + "\n" for step in (1, 2, 3, 4)]
    path.write_text("".join(lines) + '{"step": 5, "lo')  # killed while writing step 5's line
    assert [r["step"] for r in read_metrics(path, "--metrics", cut_short=True)] == [1, 2, 3, 4]
    assert continue_after(path, 2) == (1.0, tmp_path / "m.jsonl.after-step-2")  # step 2's elapsed_s
    assert path.read_text() == "".join(lines[:2])
    assert (tmp_path / "m.jsonl.after-step-2").read_text() == "".join(lines[2:]) + '{"step": 5, "lo\n'
    assert continue_after(path, 2) == (1.0, None)  # nothing after step 2 any more: no side file written


def test_plain_lines_keep_showing_the_latest_held_out_loss(capsys):
    from pipesched.training.progress_display import ProgressDisplay

    display = ProgressDisplay(3, "1f1b", terminal=False)
    row = {"loss": 1.0, "lr": 0.1, "tokens_per_s": 10.0, "step_time_s": 0.1}
    for extra in ({"step": 1}, {"step": 2, "eval_step": 2, "eval_loss": 2.0, "eval_perplexity": 7.39}, {"step": 3}):
        display.interval({**row, **extra}, 0.0)
    lines = capsys.readouterr().out.splitlines()
    assert ["eval loss" in line for line in lines] == [False, True, True]  # none before the first evaluation
    assert lines[1].split("  ")[-2] == lines[2].split("  ")[-2] == "eval loss 2.00000 (ppl 7.39, step 2)"


def test_a_fresh_run_moves_an_earlier_runs_metrics_aside_and_writes_only_its_own(tmp_path):
    """Without --resume the file starts afresh (appending mixed two runs, and a stopped run's
    summary was read back from both): the earlier lines move, byte for byte, to a side file the
    run names in one line on stderr."""
    path = tmp_path / "m.jsonl"
    earlier = "".join(json.dumps({**ROW, "step": step}) + "\n" for step in (1, 2, 3, 4, 5))
    path.write_text(earlier)
    done = _command("train", "--model", "mlp", "-s", "none", "--steps", "2", "--batch-size", "8", "--metrics", str(path),
                    timeout=120)
    kept = tmp_path / "m.jsonl.earlier-run-1"
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"pipesched: --metrics {path} held an earlier run's lines: moved to {kept} (a run without --resume starts its "
        "file afresh)"]
    assert kept.read_text() == earlier
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]


def test_each_earlier_run_gets_its_own_side_file_and_an_empty_file_stays(tmp_path):
    from pipesched.training.report.metrics_file import set_aside_earlier

    path = tmp_path / "m.jsonl"
    path.write_text("first\n")
    assert set_aside_earlier(path) == tmp_path / "m.jsonl.earlier-run-1" and not path.exists()
    path.write_text("second\n")
    assert set_aside_earlier(path) == tmp_path / "m.jsonl.earlier-run-2"
    assert [(tmp_path / f"m.jsonl.earlier-run-{n}").read_text() for n in (1, 2)] == ["first\n", "second\n"]
    path.write_text("")
    assert set_aside_earlier(path) is None and path.exists()  # nothing to keep
    assert set_aside_earlier(tmp_path / "missing.jsonl") is None
