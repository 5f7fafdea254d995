"""The Python API refuses what ``pipesched train`` refuses, in the same words: the checks before
launch (a torchrun world other than the layout's, a batch that does not split into the
microbatches, a ``tp`` that does not divide the heads, a rank memory limit the layout exceeds) are one
module, :mod:`pipesched.training.launch_checks`, that ``train`` and ``pipesched.hf.pipeline`` both call.

The API's refusals come before any process group is used, so they are checked here in one
process, with a sharded mesh whose groups the refusal never reaches."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env, concurrently, run_cli

pytest.importorskip("transformers")
import torch  # noqa: E402
from transformers import LlamaConfig  # noqa: E402

import pipesched  # noqa: E402
import pipesched.hf  # noqa: E402
from pipesched.errors import ConfigError  # noqa: E402
from pipesched.parallel_layout import ParallelLayout  # noqa: E402
from pipesched.runtime.comm.mesh import PipelineMesh  # noqa: E402
from pipesched.runtime.sharding.sharded_mesh import ShardedMesh  # noqa: E402
from pipesched.training.optimizers import make_optimizer  # noqa: E402

BATCH, SEQ = 8, 64  # train's default windows of an hf: model: 64 tokens (the model has more positions)
CONFIG = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128)


def _mesh(layout: ParallelLayout) -> ShardedMesh:
    """A rank's place in ``layout`` whose process groups are never reached (the checks come first)."""
    pipeline = PipelineMesh(layout.pp, layout.dp, 0, 0, None, None, ())
    return ShardedMesh(layout, None, pipeline, (), 0, 0, 0)


def _api_refusal(layout: ParallelLayout, batch: int = BATCH, **limit) -> str:
    ids = torch.zeros(batch, SEQ, dtype=torch.long)
    with pytest.raises(ConfigError) as refused:
        pipesched.hf.pipeline(LlamaConfig(**CONFIG), pipesched.build_schedule("1f1b", layout.pp, 4),
                              optimizer=make_optimizer("adamw", 1e-3), sample_batch={"input_ids": ids, "labels": ids},
                              mesh=_mesh(layout), **limit)
    return str(refused.value)


@pytest.mark.timeout(240)
def test_pipeline_refuses_what_train_refuses_in_the_same_words(tmp_path):
    LlamaConfig(**CONFIG).to_json_file(tmp_path / "config.json")
    model = f"hf:{tmp_path / 'config.json'}"
    train = ["train", "--model", model, "-s", "1f1b", "--ranks", "2", "-m", "4", "--batch-size", str(BATCH),
             "--optimizer", "adamw", "--lr", "1e-3"]
    split, heads, memory = concurrently(lambda extra: run_cli(*train, *extra, timeout=200), [
        ["--dp-shard", "2", "--batch-size", "12"], ["--tp", "3"], ["--dp-shard", "2", "--rank-memory-limit", "1KiB"]])
    cases = [(split, _api_refusal(ParallelLayout(2, dp_shard=2), batch=12),
              "a batch of 12 does not split into 4 equal microbatches on each of its 2 data-parallel shares (--dp x --dp-shard): use a multiple of 8"),
             (heads, _api_refusal(ParallelLayout(2, tp=3)), "tp=3 does not divide the 4 attention heads of "),
             (memory, _api_refusal(ParallelLayout(2, dp_shard=2), rank_memory_limit=1024),
              "a rank memory limit of 1 KiB: ranks=2 x dp_shard=2 x tp=1 holds up to ")]
    for done, api, words in cases:
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert words in api
        # the one line names the model as each was given it: train its file, the API its class
        assert api.replace("LlamaForCausalLM", model) in done.stderr, (api, done.stderr)


def test_a_rank_memory_limit_without_sharded_stages_is_refused():
    """As ``train --rank-memory-limit`` without ``--dp-shard`` or ``--tp``: a whole stage's memory is not predicted."""
    ids = torch.zeros(BATCH, SEQ, dtype=torch.long)
    with pytest.raises(ConfigError, match="rank_memory_limit goes with a ShardedMesh"):
        pipesched.hf.pipeline(LlamaConfig(**CONFIG), pipesched.build_schedule("1f1b", 1, 4),
                              optimizer=make_optimizer("sgd", 1e-3), sample_batch={"input_ids": ids, "labels": ids},
                              mesh=PipelineMesh(1, 1, 0, 0, None, None, ()), rank_memory_limit=1024)


TORCHRUN = {"RANK": "0", "WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}  # 8 processes


def test_a_torchrun_world_other_than_the_layout_is_refused_before_any_work(monkeypatch):
    """torchrun started 8 processes for a layout of 4: ``train`` names the layout by its flags, the
    API by its sizes, in one sentence otherwise the same (``launch_checks.check_world``)."""
    console = Path(sys.executable).with_name("pipesched")  # the installed console script
    train = subprocess.run([str(console), "train", "--model", "gpt", "-s", "1f1b", "--ranks", "2", "--dp-shard", "2"],
                           capture_output=True, text=True, timeout=120, env={**cli_env(), **TORCHRUN})
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    api = _api_refusal(ParallelLayout(2, dp_shard=2))
    assert api == ("torchrun started 8 processes but ranks=2 x dp=1 x dp_shard=2 x tp=1 needs 4: "
                   "use --nproc-per-node x --nnodes = 4")
    flags = api.replace("ranks=2 x dp=1 x dp_shard=2 x tp=1", "--ranks 2 x --dp 1 x --dp-shard 2 x --tp 1")
    assert train.returncode == 2 and train.stderr == f"pipesched: error: {flags}\n" and not train.stdout
    ids = torch.zeros(BATCH, SEQ, dtype=torch.long)
    with pytest.raises(ConfigError, match="^torchrun started 8 processes but ranks=2 x dp=2 x dp_shard=1 x tp=1 needs 4"):
        pipesched.hf.pipeline(LlamaConfig(**CONFIG), pipesched.build_schedule("1f1b", 2, 4),
                              optimizer=make_optimizer("sgd", 1e-3), sample_batch={"input_ids": ids, "labels": ids},
                              mesh=PipelineMesh(2, 2, 0, 0, None, None, ()))
