"""Every run feature at once on one layout, and each feature's check: shared by
tests/test_feature_layouts.py (one layout in the suite) and benchmarks/feature_layouts.py (all).

One launch per layout turns on every feature of ``pipesched train`` together: metrics,
TensorBoard, the report, held-out evaluation, gradient clipping that engages, recomputation of
every stage, checkpoints every step, bf16, document packing and ``-s zb-auto``, on a tiny Llama
(a Hugging Face config) trained on a token file whose documents end every 37 tokens; a second
launch resumes it for one more step. The one-process run (``-s none``) with the same features
is what each layout must equal. No pair of a feature and a layout is refused: every one
composes (this module's checks pass on all five layouts, benchmarks/feature_layouts.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

LAYOUTS = {
    "pp": ["--ranks", "2"],
    "dp": ["--ranks", "2", "--dp", "2"],
    "dp_shard": ["--ranks", "2", "--dp-shard", "2"],
    "tp": ["--ranks", "2", "--tp", "2"],
    "hsdp": ["--ranks", "1", "--dp", "2", "--dp-shard", "2"],  # dp x dp_shard
}
STEPS, RESUMED_TO = 2, 3
CLIP = 0.5  # below the first steps' gradient norms (about 0.85): the clipping engages
EOS = 2
LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=256, hidden_size=64,
             intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128, tie_word_embeddings=False, eos_token_id=EOS, bos_token_id=1)

# bf16 autocast rounds each matmul's output to 8 bits of mantissa (relative 2^-9, about 2e-3), and
# the layouts cut the batch into other microbatches and sum their gradients in other orders
# (replicas, shards, tp's row-parallel all-reduce): a microbatch's weight gradient rounds
# differently before it is summed, so the gradient norm moves by up to that rounding (measured:
# 1.6e-4 relative), and the losses of weights one SGD step (lr 0.05) apart from each other by far
# less (measured: at most 1.1e-5 relative, at every step and for the held-out loss).
LOSS_REL, NORM_REL = 1e-4, 2e-3

Run = Callable[..., "object"]  # conftest.run_cli or forked_cli


def write_inputs(folder: Path) -> tuple[Path, Path]:
    """The tiny Llama's config and a token file of documents ending every 37 tokens."""
    import numpy as np

    config, tokens = folder / "llama.json", folder / "tokens.npy"
    config.write_text(json.dumps(LLAMA))
    ids = np.random.default_rng(0).integers(EOS + 1, LLAMA["vocab_size"], size=6000)
    ids[::37] = EOS
    np.save(tokens, ids.astype(np.int32))
    return config, tokens


def _common(config: Path, tokens: Path, out: Path) -> list[str]:
    return ["--model", f"hf:{config}", "--data", str(tokens), "--packing", "documents", "--seq-len", "32",
            "--batch-size", "16", "-m", "4", "--clip-grad-norm", str(CLIP), "--dtype", "bf16",
            "--eval-share", "0.1", "--eval-every", "1", "--eval-batches", "1", "--log-every", "1",
            "--metrics", str(out / "metrics.jsonl"), "--summary", str(out / "summary.json")]


def _outcome(done, out: Path) -> dict:
    assert done.returncode == 0, done.stderr
    return {"rows": [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()],
            "summary": json.loads((out / "summary.json").read_text()), "stderr": done.stderr, "folder": out}


def reference(run: Run, folder: Path, config: Path, tokens: Path) -> dict:
    """The one-process run of every feature that has a meaning there, to the resumed step."""
    out = folder / "reference"
    out.mkdir()
    return _outcome(run("train", *_common(config, tokens, out), "-s", "none", "--steps", str(RESUMED_TO), timeout=600), out)


def launch(run: Run, folder: Path, layout: str, config: Path, tokens: Path) -> dict:
    """``layout`` with every feature for STEPS steps, then resumed to RESUMED_TO (its own outputs)."""
    first, resumed = folder / layout, folder / f"{layout}-resumed"
    first.mkdir()
    resumed.mkdir()
    checkpoints = str(first / "checkpoints")
    every = [*LAYOUTS[layout], "-s", "zb-auto", "--costs", "1,1,1", "--recompute", "all",
             "--checkpoint-dir", checkpoints, "--checkpoint-every", "1", "--checkpoint-keep", str(RESUMED_TO)]
    runs = {"first": _outcome(run("train", *_common(config, tokens, first), *every, "--steps", str(STEPS),
                                  "--tensorboard", str(first / "tb"), "--report", str(first / "report.html"),
                                  timeout=600), first)}
    runs["resumed"] = _outcome(run("train", *_common(config, tokens, resumed), *every, "--steps", str(RESUMED_TO),
                                   "--resume", timeout=600), resumed)
    return runs


def _rows(run: dict) -> list[dict]:
    return run["first"]["rows"] + run["resumed"]["rows"]


def check_metrics(run: dict, ref: dict) -> None:
    """The metrics file logs each step once, the one-process model's loss and gradient norm."""
    rows, want = _rows(run), ref["rows"]
    assert [r["step"] for r in rows] == list(range(1, RESUMED_TO + 1))
    assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in want], rel=LOSS_REL)
    assert [r["grad_norm"] for r in rows] == pytest.approx([r["grad_norm"] for r in want], rel=NORM_REL)


def check_evaluation(run: dict, ref: dict) -> None:
    rows = _rows(run)
    assert [r["eval_loss"] for r in rows] == pytest.approx([r["eval_loss"] for r in ref["rows"]], rel=LOSS_REL)


def check_clipping(run: dict, ref: dict) -> None:
    """The norms exceed the clip, so step 2's loss (and every later one) equals the one-process
    model's only if each layout clipped as it did (check_metrics holds that)."""
    assert all(r["grad_norm"] > CLIP for r in _rows(run))
    check_metrics(run, ref)


def check_recomputation(run: dict, ref: dict) -> None:
    """Each rank held the activations predicted for stages that keep only their inputs, to the byte."""
    for memory in run["first"]["summary"]["memory"]:
        assert memory["measured_peak_activation_bytes"] == memory["predicted_peak_activation_bytes"]


def check_checkpoint_resume(run: dict, ref: dict) -> None:
    """A checkpoint after every step, the resumed run's too; the resumed run does step 3 alone, as
    the one-process run did."""
    kept = sorted(p.name for p in (run["first"]["folder"] / "checkpoints").glob("step-*"))
    assert kept == [f"step-{s:06d}" for s in range(1, RESUMED_TO + 1)]
    assert [r["step"] for r in run["resumed"]["rows"]] == [RESUMED_TO]
    assert run["resumed"]["summary"]["losses"] == pytest.approx(ref["summary"]["losses"][STEPS:], rel=LOSS_REL)


def check_bf16(run: dict, ref: dict) -> None:
    assert run["first"]["summary"]["dtype"] == ref["summary"]["dtype"] == "bf16"


def check_document_packing(run: dict, ref: dict) -> None:
    """The windows restart their positions at each document (the one-process run's losses, which
    change with the positions, are met: check_metrics)."""
    check_metrics(run, ref)


def check_zb_auto(run: dict, ref: dict) -> None:
    assert run["first"]["summary"]["schedule"] == "zb-auto"
    assert "zb-auto: planned with --costs" in run["first"]["stderr"]


def check_tensorboard(run: dict, ref: dict) -> None:
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run["first"]["folder"] / "tb"))
    events.Reload()
    logged = [(s.step, s.value) for s in events.Scalars("train/loss")]
    assert logged == [(r["step"], float(np.float32(r["loss"]))) for r in run["first"]["rows"]]


def check_report(run: dict, ref: dict) -> None:
    page = (run["first"]["folder"] / "report.html").read_text()
    assert "zb-auto" in page and "loss per logging interval" in page


CHECKS = {"metrics": check_metrics, "tensorboard": check_tensorboard, "report": check_report,
          "evaluation": check_evaluation, "clipping": check_clipping, "recomputation": check_recomputation,
          "checkpoint/resume": check_checkpoint_resume, "bf16": check_bf16,
          "document packing": check_document_packing, "zb-auto": check_zb_auto}
