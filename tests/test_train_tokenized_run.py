"""A training run people would launch, through the console script: a tiny Llama whose folder holds
a BPE tokenizer trained on the shipped text, its documents as .jsonl and .parquet, a cosine
learning-rate schedule with warm-up, held-out evaluation, metrics as JSON lines and TensorBoard
scalars (the bubble share measured and simulated among them), an HTML report; documents packed
with --packing documents.

Three launches: A under zb-v on 2 ranks (checkpoint at step 3); C under 1f1b at --dp 2 on the
.parquet copy (alongside A); B resuming A's step-3 checkpoint under zb-v. B ends bitwise where A
ends; C trains the same batches to A's weights within fp32's reordering; A's held-out loss is
the one-process model's on the same batches."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import pytest
from conftest import run_cli

pytest.importorskip("transformers")
pytest.importorskip("pyarrow")
pytest.importorskip("tensorboard")
import torch  # noqa: E402
from tokenizer_cases import model_folder, shipped_documents, write_jsonl, write_parquet  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(600)]  # the fixture: three launches, two at once

STEPS, BATCH, SEQ, EVAL_BATCHES, SHARE = 5, 8, 16, 2, 0.2
COMMON = ["--steps", str(STEPS), "--batch-size", str(BATCH), "-m", "4", "--seq-len", str(SEQ), "--optimizer", "adamw",
          "--lr", "1e-3", "--lr-schedule", "cosine", "--warmup", "2", "--min-lr", "1e-4", "--eval-share", str(SHARE),
          "--eval-every", "5", "--eval-batches", str(EVAL_BATCHES), "--packing", "documents"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, forked_cli):
    """The three launches' folders (each: params.pt, summary.json, metrics.jsonl; A also tb/, report.html),
    each forked from one process that imported torch (conftest.forked_cli)."""
    root = tmp_path_factory.mktemp("runs")
    docs = shipped_documents()
    model = model_folder(root / "llama")
    data = {"jsonl": write_jsonl(root / "docs.jsonl", docs), "parquet": write_parquet(root / "docs.parquet", docs)}
    out = {name: root / name for name in "ABC"}
    for folder in out.values():
        folder.mkdir()

    def launch(name: str, data_kind: str, *args: str):
        folder = out[name]
        return forked_cli("train", "--model", f"hf:{model / 'config.json'}", "--data", str(data[data_kind]), *COMMON,
                       "--save-params", str(folder / "params.pt"), "--summary", str(folder / "summary.json"),
                       "--metrics", str(folder / "metrics.jsonl"), *args, timeout=280)

    a_args = ["-s", "zb-v", "--ranks", "2", "--checkpoint-dir", str(out["A"] / "ck"), "--checkpoint-every", "3",
              "--checkpoint-keep", "3", "--tensorboard", str(out["A"] / "tb"), "--report", str(out["A"] / "report.html"),
              "--trace", str(out["A"] / "trace.json")]
    with ThreadPoolExecutor(2) as pool:  # A and C at once (each tokenizes into its own cache entry)
        a, c = pool.map(lambda job: launch(*job), [("A", "jsonl", *a_args), ("C", "parquet", "-s", "1f1b", "--ranks", "1", "--dp", "2")])
    assert a.returncode == 0, a.stderr
    assert c.returncode == 0, c.stderr
    shutil.copytree(out["A"] / "ck" / "step-000003", out["B"] / "ck" / "step-000003")
    b = launch("B", "jsonl", "-s", "zb-v", "--ranks", "2", "--checkpoint-dir", str(out["B"] / "ck"), "--resume")
    assert b.returncode == 0, b.stderr
    return {"model": model, "data": data, **out, "printed": {"A": a.stdout, "B": b.stdout}}


def params(folder: Path) -> dict:
    return torch.load(folder / "params.pt", weights_only=True)


def summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_resumed_at_step_3_the_run_ends_bitwise_where_the_uninterrupted_one_does(runs):
    a, b = summary(runs["A"]), summary(runs["B"])
    assert b["lrs"] == a["lrs"][3:] and b["losses"] == a["losses"][3:]  # data position and learning rate included
    want = params(runs["A"])
    got = params(runs["B"])
    assert all(torch.equal(got[name], want[name]) for name in want)


def test_every_layout_trains_the_same_batches_to_the_same_weights(runs):
    from runtime_cases import relative_error

    a, c = summary(runs["A"]), summary(runs["C"])
    assert c["lrs"] == a["lrs"]  # the closed form of the step: the same numbers
    # 1f1b at --dp 2 sums the gradients in another order (two shards, then the replicas' mean):
    # fp32 rounding, amplified by AdamW where a gradient is near its own rounding
    # (docs/huggingface.md, "fp32 and AdamW")
    assert c["losses"] == pytest.approx(a["losses"], rel=1e-5)
    assert relative_error(params(runs["C"]), params(runs["A"])) < 1e-4


def test_the_held_out_loss_is_the_one_process_models_on_the_same_batches(runs):
    from pipesched.training.evaluation import evaluate_model
    from pipesched.training.models import get_model

    for name, data_kind, tolerance in (("A", "jsonl", 1e-6), ("C", "parquet", 4e-6)):
        md = get_model(f"hf:{runs['model'] / 'config.json'}", data=str(runs["data"][data_kind]), context=SEQ,
                       eval_share=SHARE, packing="documents")
        model = md.sequential(0)
        model.load_state_dict(params(runs[name]))
        want = evaluate_model(md, model, [md.eval_batch(i, BATCH) for i in range(EVAL_BATCHES)], nullcontext)
        last = metrics(runs[name])[-1]
        assert last["eval_step"] == STEPS and summary(runs[name])["evals"] == [{"step": STEPS, "loss": last["eval_loss"]}]
        # A (one replica) runs the same blocks on the same whole batches as the model: the same
        # float operations. C's two replicas each take the mean over half the batch's tokens, then
        # the mean of the two: fp32 sums of 60 and 120 terms of ~4.8 in another order, a few ulp
        # (4.8 x 2^-23 = 5.7e-7 each) of the mean apart
        assert last["eval_loss"] == pytest.approx(want, abs=tolerance), name
        assert last["eval_perplexity"] == pytest.approx(torch.tensor(want).double().exp().item(), rel=1e-5)


def test_metrics_are_json_lines_and_tensorboard_scalars_its_reader_reads_back(runs):
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = metrics(runs["A"])
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in rows] == summary(runs["A"])["losses"]
    assert [r["lr"] for r in rows] == summary(runs["A"])["lrs"]
    for row in rows:
        assert row["tokens_per_s"] == pytest.approx(BATCH * SEQ / row["step_time_s"], rel=1e-9)
        assert row["tokens_per_s_per_device"] == pytest.approx(row["tokens_per_s"] / 2, rel=1e-12)
        assert len(row["peak_memory_bytes"]) == 2 and min(row["peak_memory_bytes"]) > 0
        assert row["grad_norm"] > 0
        assert "mfu" not in row  # on CPU no peak is known and none was given
    events = EventAccumulator(str(runs["A"] / "tb"))
    events.Reload()
    for name in ("loss", "lr", "grad_norm", "tokens_per_s", "bubble_share", "simulated_bubble_share"):
        scalars = events.Scalars(f"train/{name}")
        assert [s.step for s in scalars] == [r["step"] for r in rows]
        assert [s.value for s in scalars] == [float(np.float32(r[name])) for r in rows]  # stored as float32
    (evaluation,) = events.Scalars("eval/loss")
    assert (evaluation.step, evaluation.value) == (STEPS, float(np.float32(rows[-1]["eval_loss"])))


def test_each_interval_carries_its_bubble_share_measured_from_the_spans_and_simulated(runs):
    """Each metrics line's measured bubble share is the one of the step's spans (the --trace file
    holds them), its simulated share simulate()'s for zb-v under the costs it names."""
    from pipesched import Costs, build_schedule, simulate
    from pipesched.actions import Action
    from pipesched.execution import Span
    from pipesched.runtime.metering.bubble_share import idle_shares, interval_costs

    schedule = build_schedule("zb-v", 2, 4)
    steps = json.loads((runs["A"] / "trace.json").read_text())["otherData"]["measured_steps"]
    rows = metrics(runs["A"])
    assert len(steps) == len(rows) == STEPS  # --log-every 1: one step an interval
    for row, step in zip(rows, steps):
        timeline = [[Span(Action.parse(a), start, end) for a, start, end in rank] for rank in step]
        assert 0 <= row["bubble_share"] <= 1 and 0 <= row["simulated_bubble_share"] <= 1
        assert row["bubble_share_per_rank"] == idle_shares([timeline])  # from the meters, the same float operations
        assert row["bubble_share"] == pytest.approx(sum(row["bubble_share_per_rank"]) / 2, rel=1e-15)
        costs = row["simulated_costs_ms"]
        want = interval_costs(schedule, [timeline], costs["comm"] / 1000)
        assert (costs["F"], costs["B"], costs["W"], costs["full_backward"]) == (want.F, want.B, want.W, want.full_backward)
        assert row["simulated_bubble_share"] == simulate(schedule, Costs(**costs)).bubble_ratio
    assert any(row["bubble_share"] != row["simulated_bubble_share"] for row in rows)


def test_the_run_report_renders_in_headless_chromium_with_its_charts(runs, tmp_path):
    from collections import Counter

    from browser import chromium, png_pixels, screenshot

    from pipesched.render.run_report import EVAL, TRAIN

    if chromium() is None:
        pytest.skip("chromium is not installed (scripts/test.sh installs it with apt-get as root)")
    page = runs["A"] / "report.html"
    html = page.read_text()
    assert "<script" not in html and "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")  # offline
    shot = tmp_path / "shot.png"
    screenshot(page, shot, width=1000, height=1000)  # the table, the loss and learning-rate charts
    pixels = Counter(p for row in png_pixels(shot) for p in row)
    rgb = [tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in (TRAIN, EVAL)]
    assert pixels[rgb[0]] > 300, "the training loss curve is drawn"
    assert pixels[rgb[1]] > 30, "the held-out loss point is drawn"


def test_pipesched_report_draws_a_run_from_its_metrics_file(runs, tmp_path):
    page = tmp_path / "run.html"
    done = run_cli("report", "--run", str(runs["A"] / "metrics.jsonl"), "-o", str(page))
    assert done.returncode == 0, done.stderr
    html = page.read_text()
    assert html.count("<svg") == 5 and "loss per logging interval" in html  # loss, lr, tokens/s, memory, bubble
    bad = tmp_path / "not_metrics.jsonl"
    bad.write_text('{"step": 1}\n')
    refused = run_cli("report", "--run", str(bad), "-o", str(page))
    assert refused.returncode == 2
    assert refused.stderr.strip() == (f"pipesched: error: --run {str(bad)!r}: line 1 is not a metrics line of "
                                      "pipesched train (no loss, lr, tokens_per_s, step_time_s, peak_memory_bytes)")


def test_the_summary_line_names_its_two_losses_and_the_final_held_out_loss(runs):
    """Piped (no terminal), A's progress lines carry the rate and, after step 5's evaluation,
    the held-out loss; its summary names the steps of its two losses and the last evaluation."""
    a = summary(runs["A"])
    printed = runs["printed"]["A"].splitlines()
    (fifth,) = [line for line in printed if line.startswith("zb-v step 5/5")]
    assert f"lr {a['lrs'][4]:.3g}" in fifth and f"eval loss {a['evals'][-1]['loss']:.5f}" in fifth
    assert any(line.startswith(f"loss of step 1 {a['losses'][0]:.6f} -> of step 5 {a['losses'][-1]:.6f}   median step ")
               and line.endswith(f"final eval loss {a['evals'][-1]['loss']:.6f} (after step 5)") for line in printed)
    assert runs["printed"]["B"].splitlines()[0].startswith("resuming from step 3 (written at ")
