"""``pipesched train --dp-shard N --tp N`` through the console script: a sharded run trains as the
one-process run does and its summary holds the bytes each rank measured beside the layout's
prediction; layouts that cannot run are refused in one line (exit 2) before any rank starts."""

from __future__ import annotations

import json

import pytest

from conftest import concurrently, run_cli

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]
GPT = ["--model", "gpt", "--ranks", "2", "--steps", "2", "--batch-size", "16", "--optimizer", "adamw"]


@pytest.mark.timeout(300)
def test_a_sharded_run_trains_as_one_process_and_measures_what_it_predicts(tmp_path):
    sharded, whole = concurrently(lambda args: run_cli("train", *GPT, *args, timeout=240), [
        ["-s", "zb-v", "--dp-shard", "2", "--summary", str(tmp_path / "sharded.json")],
        ["-s", "none", "--summary", str(tmp_path / "whole.json")],
    ])
    assert sharded.returncode == 0, sharded.stderr
    assert whole.returncode == 0, whole.stderr
    got, want = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("sharded", "whole"))
    # fp32 sums in another order (microbatches, shards): a few ulps of a loss near 4
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-5)
    for rank in got["memory"]:
        assert rank["measured_state_bytes"] == rank["predicted_state_bytes"], rank
        assert rank["measured_state_bytes"]["optimizer"] > 0  # AdamW's two moments, sharded


REFUSED = [
    (["--model", "gpt", "--tp", "3"], "--tp 3 does not divide the 4 attention heads of --model gpt"),
    (["--model", "mlp", "--tp", "2"], "--model mlp has no tensor-parallel plan"),
    (["--model", "gpt", "-s", "none", "--tp", "2"], "--tp needs a pipeline"),
    (["--model", "gpt", "--dp-shard", "0"], "--dp-shard must be at least 1"),
    (["--model", "gpt", "--dp-shard", "2", "--batch-size", "8"], "does not split into 8 equal microbatches on each of 2 replicas"),
]


@pytest.mark.timeout(300)
def test_layouts_that_cannot_run_are_refused_in_one_line_before_any_rank_starts():
    results = concurrently(lambda row: run_cli("train", "--ranks", "2", *row[0]), REFUSED)
    for (args, message), done in zip(REFUSED, results):
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
