"""Checkpoints across expert-parallel degrees (docs/expert-parallel.md, "Checkpoints"): each rank
saves its experts under the whole layer's names at their global expert indices, so a checkpoint
saved at ``ep 2`` resumes at ``ep 1``, at another layout, and back.

One 4-rank launch (tests/expert_checkpoint_cases.py), the tiny Mixtral of tests/hf_cases.py (4
layers, 4 experts, 2 per token) in float64 throughout with AdamW, batches of 8: saved after step 1
at pp 2 x dp 2 x ep 2, then resumed for step 2 at the same layout, at pp 2 x dp 2 (ep 1), and at
pp 2 x dp_shard 2 x ep 2 (FSDP's DTensors beside the experts' pieces) from the ep 1 run's
checkpoint: ep 2 -> ep 1 -> ep 2; and from the first checkpoint at pp 1 x dp_shard 4 x ep 2 (each
rank's experts FSDP-sharded over the 2 ranks holding them: its row of them, saved at that row's
global index), whose checkpoint pp 1 x dp_shard 2 x tp 2 x ep 2 resumes (experts whole on each tp
rank, the rest tensor-parallel).

- At the same layout the resumed run is bit for bit the uninterrupted one: the same operations on
  the same values.
- Every checkpoint saved again right after a load holds every entry of the one it loaded, bit for
  bit (weights, AdamW's moments and step, every expert's): the state moved exactly.
- Across layouts step 2 sums in other orders (microbatch rows, each expert's rows from other
  ranks, FSDP's reduce-scatter); in float64 each sum is within ``k * 2^-53`` of exact and AdamW's
  step ``m / (sqrt(v) + eps)`` moves with a gradient's relative error, so the loss and weights are
  within ``TOL`` 1e-10 relative of the uninterrupted run (tests/test_hf_pipeline.py's bound and
  reasoning; tests/test_expert_parallel.py checks the layouts themselves to 1e-10).

benchmarks/expert_parallel.py ``--checkpoints`` runs the matrix (Qwen3-MoE, DeepSeek-V3, more layouts).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli

pytest.importorskip("transformers")
import torch  # noqa: E402
from expert_checkpoint_cases import differing, entries, expert_checkpoints  # noqa: E402
from hf_cases import make_batch  # noqa: E402
from runtime_cases import relative_error  # noqa: E402

from pipesched.runtime.launching.launch import spawn  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]
TOL = 1e-10  # float64 throughout, sums in other orders (module docstring)
SAVED_AT = (2, {"dp": 2, "ep": 2})
RESUMED = {  # label -> (pp, sizes, the checkpoint it loads)
    "ep 2 again": (2, {"dp": 2, "ep": 2}, "uninterrupted"),
    "ep 1": (2, {"dp": 2}, "uninterrupted"),
    "dp_shard 2 ep 2 from ep 1": (2, {"dp_shard": 2, "ep": 2}, "ep 1"),
    "dp_shard 4 ep 2": (1, {"dp_shard": 4, "ep": 2, "m": 2}, "uninterrupted"),  # each rank 1 row of its 2 experts
    "dp_shard 2 tp 2 ep 2 from dp_shard 4 ep 2": (1, {"dp_shard": 2, "tp": 2, "ep": 2, "m": 2}, "dp_shard 4 ep 2"),
}


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ep-checkpoints")
    job = {"kind": "mixtral", "schedule": "1f1b", "microbatches": 4, "folder": str(folder),
           "batches": [make_batch(step, 8, 16) for step in range(2)], "saved_at": SAVED_AT, "resumed": RESUMED}
    return spawn(expert_checkpoints, 4, job, timeout_s=540)[0] | {"folder": folder}


@pytest.mark.timeout(600)
def test_each_rank_saves_its_experts_at_their_global_indices(resumed):
    import torch.distributed.checkpoint as dcp

    saved = dcp.FileSystemReader(resumed["checkpoints"]["uninterrupted"]).read_metadata().state_dict_metadata
    for name in ("model.model.layers.0.mlp.experts.gate_up_proj", "optim.state.model.layers.0.mlp.experts.down_proj.exp_avg"):
        assert saved[name].size[0] == 4, name  # the whole layer's 4 experts, as one process names them
        assert sorted(chunk.offsets[0] for chunk in saved[name].chunks) == [0, 2], name  # ep rank 1's at expert 2
    sharded = dcp.FileSystemReader(resumed["checkpoints"]["dp_shard 4 ep 2"]).read_metadata()
    entry = sharded.state_dict_metadata["model.model.layers.0.mlp.experts.gate_up_proj"]
    assert entry.size[0] == 4 and sorted(chunk.offsets[0] for chunk in entry.chunks) == [0, 1, 2, 3]  # a row each


def test_the_state_moves_exactly_between_ep_degrees_and_layouts(resumed):
    want = entries(resumed["checkpoints"]["uninterrupted"])
    assert any(".experts." in k and k.endswith("exp_avg_sq") for k in want)
    for label in RESUMED:
        assert differing(entries(resumed["checkpoints"][label]), want) == [], label
        assert resumed["runs"][label]["loaded_step"] == 1, label


def test_resumed_at_the_same_layout_is_bitwise_the_uninterrupted_run(resumed):
    want, got = resumed["runs"]["uninterrupted"], resumed["runs"]["ep 2 again"]
    assert got["loss"] == want["loss"]
    assert all(torch.equal(got["params"][k], v) for k, v in want["params"].items())


def test_resumed_at_other_layouts_is_the_uninterrupted_run_within_rounding(resumed):
    want = resumed["runs"]["uninterrupted"]
    for label in set(RESUMED) - {"ep 2 again"}:
        got = resumed["runs"][label]
        assert got["loss"] == pytest.approx(want["loss"], rel=TOL), label
        assert relative_error(got["params"], want["params"]) < TOL, label


def test_save_pretrained_from_an_ep_checkpoint_writes_every_expert(resumed):
    """The run loaded at ep 2 wrote transformers' folder at once: the checkpoint's weights, each expert."""
    from transformers import AutoModelForCausalLM

    saved = entries(resumed["checkpoints"]["uninterrupted"])
    model = AutoModelForCausalLM.from_pretrained(resumed["folder"] / "ep 2 again-hf", dtype=torch.float64)
    state = model.state_dict()
    assert state.keys() == {k[len("model."):] for k in saved if k.startswith("model.")}
    assert all(torch.equal(v, saved[f"model.{k}"]) for k, v in state.items())


@pytest.mark.timeout(300)
def test_train_writes_a_checkpoint_at_ep_2_that_verify_and_save_hf_agree_with(tmp_path):
    """``train --ep 2 --checkpoint-dir`` (refused before) writes a checkpoint that ``checkpoint verify``
    finds intact and whose weights are, bit for bit, what ``--save-hf`` gathered at the end of the run
    (each expert from its rank, another path: an all_gather over the EP group)."""
    from transformers import AutoModelForCausalLM

    ck, out = tmp_path / "ck", tmp_path / "out"
    run = run_cli("train", "--model", "hf:docs/examples/mixtral-tiny.json", "-s", "1f1b", "--ranks", "1", "--dp", "2",
                  "--ep", "2", "-m", "2", "--batch-size", "4", "--seq-len", "16", "--steps", "1",
                  "--checkpoint-dir", str(ck), "--save-hf", str(out), timeout=240, cwd=Path(__file__).parents[1])
    assert run.returncode == 0, run.stderr
    verified = run_cli("checkpoint", "verify", str(ck))
    assert verified.returncode == 0 and "step-000001: intact" in verified.stdout, verified.stdout + verified.stderr
    saved = entries(str(ck / "step-000001"))
    state = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert saved["model.model.layers.0.mlp.experts.gate_up_proj"].shape[0] == 4  # docs/examples/mixtral-tiny.json's
    assert state.keys() == {k[len("model."):] for k in saved if k.startswith("model.")}
    assert all(torch.equal(v, saved[f"model.{k}"]) for k, v in state.items())
