"""``pipesched train --dp-shard N --tp N`` through the console script: a sharded run trains as the
one-process run does, its summary holds the bytes each rank measured beside the layout's
prediction, and its checkpoint resumes in one process; layouts that cannot run (or cannot fit
``--rank-memory-limit``) are refused in one line (exit 2) before any rank starts."""

from __future__ import annotations

import json
import re

import pytest

from conftest import concurrently, run_cli

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]
GPT = ["--model", "gpt", "--ranks", "2", "--batch-size", "16", "--optimizer", "adamw"]
SHARDED = [*GPT, "-s", "zb-v", "--dp-shard", "2", "--steps", "2"]


@pytest.mark.timeout(300)
def test_a_sharded_run_trains_as_one_process_measures_what_it_predicts_and_resumes_in_one_process(tmp_path, forked_cli):
    """The sharded run's checkpoint (DCP: each rank's shards of the weights and AdamW's state under
    the unsplit model's names) loads into the one-process model bit for bit and resumes there, its
    steps 3 and 4 as the uninterrupted run's. A --rank-memory-limit the layout's predicted weights,
    gradients, optimizer state and activations exceed is refused before any rank starts, naming
    the bytes; the activations it predicts are the ones the run measures."""
    import pipesched
    from pipesched.training.launch_checks import PARTS, activation_peaks, rank_state, stage_specs, state_slots
    from pipesched.memory import format_bytes
    from pipesched.parallel_layout import ParallelLayout
    from pipesched.runtime.checkpoints import checkpoint
    from pipesched.runtime.options import RuntimeOptions
    from pipesched.training.models import get_model
    from pipesched.training.optimizers import make_optimizer
    from pipesched.training.train import TrainConfig, train_reference

    sharded, whole, refused = concurrently(lambda args: forked_cli("train", *args, timeout=240), [
        [*SHARDED, "--summary", str(tmp_path / "sharded.json"), "--checkpoint-dir", str(tmp_path / "ck"),
         "--save-params", str(tmp_path / "sharded.pt")],
        [*GPT, "-s", "none", "--steps", "4", "--summary", str(tmp_path / "whole.json")],
        [*SHARDED, "--rank-memory-limit", "1MiB"],
    ])
    assert sharded.returncode == 0, sharded.stderr
    assert whole.returncode == 0, whole.stderr
    got, want = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("sharded", "whole"))
    # fp32 sums in another order (microbatches, shards): a few ulps of a loss near 4
    assert got["losses"] == pytest.approx(want["losses"][:2], rel=1e-5)
    for rank in got["memory"]:
        assert rank["measured_state_bytes"] == rank["predicted_state_bytes"], rank
        assert rank["measured_state_bytes"]["optimizer"] > 0  # AdamW's two moments, sharded
    # and what the advisor predicts from the gpt's sizes for the run's blocks (tests/advised_bytes.py)
    from advised_bytes import advised_state_bytes, gpt_defaults

    from pipesched.parallel_layout import runtime_layout
    from pipesched.runtime.stages.copies import balanced_block_counts

    schedule = pipesched.build_schedule("zb-v", 2, got["microbatches"])
    counts = balanced_block_counts(get_model("gpt").block_costs, schedule)
    for rank in got["memory"]:
        advised = advised_state_bytes(gpt_defaults(), runtime_layout(2, 1, 2, 1), schedule.placement, counts,
                                      rank["rank"], slots=2)
        assert rank["measured_state_bytes"] == advised, rank

    md = get_model("gpt")
    model = md.sequential(0)
    optimizer = make_optimizer("adamw", 0.05)(list(model.parameters()))
    saved = tmp_path / "ck" / "step-000002"
    assert checkpoint.load(saved, checkpoint.tied_view(model, md.tied, md.checkpoint_name), optimizer) == 2
    trained = torch.load(tmp_path / "sharded.pt")  # the sharded ranks' weights after step 2, gathered
    assert model.state_dict().keys() == trained.keys()
    assert all(torch.equal(model.state_dict()[k], trained[k]) for k in trained)
    moments = optimizer.state_dict()["state"].values()
    assert len(moments) == len(trained) and all(int(m["step"]) == 2 and m["exp_avg_sq"].any() for m in moments)
    resumed = train_reference(TrainConfig("gpt", None, 4, 16, RuntimeOptions(seed=0), lr=0.05, optimizer="adamw",
                                          resume_from=str(saved)))
    assert resumed.losses == pytest.approx(want["losses"][2:], rel=1e-5)

    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    # what the refusal adds up, per rank: the bytes the run measured between steps (params, grads,
    # optimizer: each rank's summary), plus the gathered parameters and unsharded gradients of a step
    plan = pipesched.build_schedule("zb-v", 2, 8)
    stages = stage_specs(md, plan, None, tp=1)
    held = [rank_state(plan, stages, ParallelLayout(2, dp_shard=2), state_slots(make_optimizer("adamw", 1e-3)), r["rank"]) for r in got["memory"]]
    for rank, parts in zip(got["memory"], held):
        assert {k: parts[k] for k in rank["measured_state_bytes"]} == rank["measured_state_bytes"]
    # plus the activations at the schedule's peak, predicted before launch from one fake microbatch
    # (16 samples / (2 shards x 8 microbatches)): the sizes the run measured on its first step, so
    # the run's own prediction to the byte, and what it measured within the runtime's check (5%)
    activations = activation_peaks(md, plan, None, 16, 2, 0, None, torch.float32)
    for rank in got["memory"]:
        assert activations[rank["rank"]] == rank["predicted_peak_activation_bytes"], rank
        assert rank["measured_peak_activation_bytes"] == pytest.approx(activations[rank["rank"]], rel=0.05), rank
    totals = [sum(parts.values()) + activations[r["rank"]] for parts, r in zip(held, got["memory"])]
    top = max(range(len(held)), key=totals.__getitem__)
    most = held[top]
    assert (f"holds up to {format_bytes(totals[top])} per rank (pipeline rank {got['memory'][top]['rank']}) "
            f"with {format_bytes(activations[got['memory'][top]['rank']])} of activations at the schedule's peak, "
            f"the largest part of its state {PARTS[max(most, key=most.get)]}") in refused.stderr, refused.stderr


REFUSED = [
    (["--model", "gpt", "--tp", "3"], "tp=3 does not divide the 4 attention heads of gpt"),
    (["--model", "mlp", "--tp", "2"], "tp=2: mlp has no tensor-parallel plan"),
    (["--model", "gpt", "-s", "none", "--tp", "2"], "--tp needs a pipeline"),
    (["--model", "gpt", "--dp-shard", "0"], "--dp-shard must be at least 1"),
    (["--model", "gpt", "--dp-shard", "2", "--batch-size", "8"], "does not split into 8 equal microbatches on each of its 2 data-parallel shares (--dp x --dp-shard)"),
]


@pytest.mark.timeout(300)
def test_layouts_that_cannot_run_are_refused_in_one_line_before_any_rank_starts(tmp_path):
    from transformers import LlamaConfig, Phi3Config

    # every matrix and norm of this Llama has 4 rows: 8 shards leave 4 ranks of a stage nothing to hold
    LlamaConfig(vocab_size=4, hidden_size=4, intermediate_size=4, num_hidden_layers=2, num_attention_heads=1,
                num_key_value_heads=1, head_dim=4).to_json_file(tmp_path / "config.json")
    # Phi-3's fused q|k|v and gate|up: FSDP2 shards their 32 input features, only evenly
    Phi3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=4, pad_token_id=0).to_json_file(tmp_path / "phi3.json")
    rows = [*REFUSED, (["--model", f"hf:{tmp_path / 'config.json'}", "--dp-shard", "8", "--batch-size", "128"],
                       "dp_shard=8 cuts stage 0 into more shards than it has elements to give"),
            (["--model", f"hf:{tmp_path / 'phi3.json'}", "--tp", "2", "--dp-shard", "3", "--batch-size", "24"],
             "dp_shard=3 does not divide the 32 input features of a fused projection in stage 0")]
    results = concurrently(lambda row: run_cli("train", "--ranks", "2", *row[0]), rows)
    for (args, message), done in zip(rows, results):
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)


def test_under_tp_and_for_hugging_face_models_the_memory_limit_counts_activations_and_says_when_it_cannot(tmp_path):
    """The refusal's figure holds the activations predicted on fake tensors under --tp (each
    stage parallelised on a fake mesh, which leaves no process group behind) and for a Hugging
    Face Llama and Mixtral (the runs' own predictions to the byte: tests/test_sharded_pipelines.py,
    tests/test_hf_cli.py, tests/test_hf_cli_checkpoints.py); a model whose layers fail on fake
    tensors (Mixtral's experts in transformers' eager loop, which picks tokens by value) is
    refused on its state alone and says so. Checked in process (the CLI turns the ConfigError into its one
    line, exit 2, as for every refusal above)."""
    import torch.distributed as dist
    from hf_cases import make_config
    from transformers import LlamaConfig

    import pipesched
    from pipesched.training.launch_checks import activation_peaks, check_sharded_stages
    from pipesched.errors import ConfigError
    from pipesched.memory import format_bytes
    from pipesched.parallel_layout import ParallelLayout
    from pipesched.training.models import get_model

    plan = pipesched.build_schedule("1f1b", 2, 8)
    plain_sgd = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731  (no optimizer state)
    LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2).to_json_file(tmp_path / "config.json")
    make_config("mixtral").to_json_file(tmp_path / "mixtral.json")
    make_config("mixtral", experts_implementation="eager").to_json_file(tmp_path / "eager.json")
    hf_llama, mixtral = f"hf:{tmp_path / 'config.json'}", f"hf:{tmp_path / 'mixtral.json'}"
    for model, dp_shard, tp in (("gpt", 1, 2), (hf_llama, 2, 1), (hf_llama, 1, 2), (mixtral, 2, 1), (mixtral, 1, 2)):
        md = get_model(model)
        peaks = activation_peaks(md, plan, None, 16, dp_shard, 0, None, torch.float32, tp)
        assert not dist.is_initialized()
        either = "|".join(re.escape(format_bytes(p)) for p in peaks)  # the rank holding the most in all
        with pytest.raises(ConfigError, match=rf"with ({either}) of activations at the schedule's peak"):
            check_sharded_stages(md, plan, None, ParallelLayout(2, 1, dp_shard, tp), plain_sgd, 1024, batch_size=16,
                                 seed=0)
    with pytest.raises(ConfigError, match=rf"before any activation \(not predicted for hf:.*eager.json, "
                                          "which fails on fake tensors: aten.nonzero"):
        check_sharded_stages(get_model(f"hf:{tmp_path / 'eager.json'}"), plan, None, ParallelLayout(2, 1, 2, 1), plain_sgd, 1024,
                             batch_size=16, seed=0)
