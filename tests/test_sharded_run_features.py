"""Run features over sharded layouts, through the console script's entry point (issue 39's two combinations
that could never run): ``-s zb-auto`` on ``--dp-shard 2`` and ``-s auto`` on ``--tp 2``, each under
a ``--memory-limit`` that only recomputation meets, recompute and train as the one-process model;
with them and with HSDP (``--dp 2 --dp-shard 2``), ``--metrics``, ``--tensorboard`` and
``--report`` log the whole model's gradient norm, the one-process model's. Four launches at
once, forked from one process that imported torch (conftest.forked_cli); the runtime's side (recomputed runs bit for bit the stored ones, the norm each element
once, every schedule family) is tests/test_sharded_pipelines.py's."""

from __future__ import annotations

import json

import pytest

from conftest import concurrently

pytest.importorskip("torch")
pytest.importorskip("tensorboard")
pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(600)]  # the fixture: 4 launches, 2 profiled

GPT = ["--model", "gpt", "--ranks", "2", "--batch-size", "16", "--steps", "2", "--log-every", "1"]
LAUNCHES = {
    # below 1 M_B only a recomputing schedule fits (docs/automatic.md)
    "zb-auto dp_shard 2": ["-s", "zb-auto", "-m", "4", "--memory-limit", "0.8", "--recompute-input", "0.1",
                           "--dp-shard", "2"],
    # the gpt's profiled sizes leave two candidates within 1.1 MiB, interleaved-1f1b and
    # interleaved-zb at 3 chunks, both recomputing every stage (advise_from_profile's fitting ones)
    "auto tp 2": ["-s", "auto", "--memory-limit", "1.1MiB", "--tp", "2"],
    "hsdp": ["-s", "1f1b", "-m", "4", "--dp", "2", "--dp-shard", "2"],
    "one process": ["-s", "none"],
}
SHARDED = ("zb-auto dp_shard 2", "auto tp 2", "hsdp")
LAYOUTS = {"zb-auto dp_shard 2": (2, 1, 2, 1), "auto tp 2": (2, 1, 1, 2), "hsdp": (2, 2, 2, 1)}  # pp, dp, dp_shard, tp
SAID = {"zb-auto dp_shard 2": "zb-auto: recomputing stages 0,1,2,3 to fit the memory limit",
        "auto tp 2": "auto: recomputing every stage's activations (--recompute all) to fit"}


@pytest.fixture(scope="module")
def launched(tmp_path_factory, forked_cli) -> dict:
    """Each launch's metrics rows, summary and stderr; the sharded ones also wrote a report and
    TensorBoard scalars (each command forked from one process that imported torch: conftest.forked_cli)."""
    root = tmp_path_factory.mktemp("features")

    def launch(label: str):
        folder = root / label.replace(" ", "_")
        folder.mkdir()
        sharded = ["--tensorboard", str(folder / "tb"), "--report", str(folder / "report.html")] if label in SHARDED else []
        done = forked_cli("train", *GPT, *LAUNCHES[label], "--metrics", str(folder / "metrics.jsonl"),
                       "--summary", str(folder / "summary.json"), *sharded, timeout=280)
        assert done.returncode == 0, (label, done.stderr)
        return {"rows": [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()],
                "summary": json.loads((folder / "summary.json").read_text()), "stderr": done.stderr, "folder": folder}

    return dict(zip(LAUNCHES, concurrently(launch, list(LAUNCHES))))


def test_every_layout_logs_the_one_process_models_loss_and_gradient_norm(launched):
    """fp32 sums in another order (microbatches, shards, tp's row-parallel all-reduce): the
    gradients within 1e-5 relative of the one-process model's (tests/test_sharded_pipelines.py), so
    their norm too (| ||g|| - ||g'|| | <= ||g - g'||), and the losses of weights so trained."""
    want = launched["one process"]["rows"]
    for label in SHARDED:
        got = launched[label]["rows"]
        assert [r["step"] for r in got] == [1, 2], label
        for name in ("loss", "grad_norm"):
            assert [r[name] for r in got] == pytest.approx([r[name] for r in want], rel=1e-5), (label, name)
        assert got[0]["grad_norm"] != got[1]["grad_norm"]  # each step's own


def test_the_scalars_and_the_report_carry_the_logged_metrics(launched):
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for label in SHARDED:
        run = launched[label]
        events = EventAccumulator(str(run["folder"] / "tb"))
        events.Reload()
        scalars = events.Scalars("train/grad_norm")
        assert [(s.step, s.value) for s in scalars] == [(r["step"], float(np.float32(r["grad_norm"]))) for r in run["rows"]]
        report = (run["folder"] / "report.html").read_text()
        assert "loss per logging interval" in report, label
        pp, dp, dp_shard, tp = LAYOUTS[label]  # the headline and --summary name the whole layout
        assert (run["summary"]["ranks"], run["summary"]["dp"], run["summary"]["dp_shard"], run["summary"]["tp"]) == LAYOUTS[label]
        assert f"layout {pp} pp × {dp} dp × {dp_shard} dp_shard × {tp} tp ({pp * dp * dp_shard * tp} processes)" in report


def test_auto_and_zb_auto_recompute_on_sharded_stages_when_only_that_fits(launched):
    for label, said in SAID.items():
        assert said in launched[label]["stderr"], launched[label]["stderr"]
        assert launched[label]["summary"]["losses"] == pytest.approx(launched["one process"]["summary"]["losses"], rel=1e-5)
