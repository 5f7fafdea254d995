"""The metrics of each logging interval, in one process (the reference run): intervals of
``--log-every`` steps with their mean loss and last rate, JSON lines, plain progress lines when
not on a terminal, the MFU from the model's FLOPs per token and a given peak."""

from __future__ import annotations

import json

import pytest

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
