"""``pipesched train --model hf:CONFIG.json`` through the real entry point: a Hugging Face causal
LM from its config trains under a zero-bubble schedule with sharded stages as the single-process
model does, writes a folder ``from_pretrained`` loads and checkpoints under the model's own names,
fits the ``--memory-limit`` its predicted bytes (activations too) fill and is refused a byte below; ``advise
--profile`` and ``train -s auto`` choose a schedule for it; bad input is one line and exit 2
before any rank starts."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import concurrently, run_cli

pytest.importorskip("transformers")
import torch  # noqa: E402
from hf_cases import make_config  # noqa: E402

import pipesched  # noqa: E402
from pipesched.memory import format_bytes  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("configs")
    paths = {}
    for kind in ("llama", "gpt2"):
        paths[kind] = folder / f"{kind}.json"
        make_config(kind).to_json_file(str(paths[kind]))
    paths["bert"] = folder / "bert.json"
    paths["bert"].write_text(json.dumps({"model_type": "bert", "vocab_size": 64}))
    paths["t5"] = folder / "t5.json"
    paths["t5"].write_text(json.dumps({"model_type": "t5", "vocab_size": 64, "num_layers": 2}))
    paths["gpt2-dropout"] = folder / "gpt2-dropout.json"
    make_config("gpt2", resid_pdrop=0.1, attn_pdrop=0.1).to_json_file(str(paths["gpt2-dropout"]))
    paths["broken"] = folder / "broken.json"
    paths["broken"].write_text("{not json")
    paths["ids"] = folder / "ids.npy"
    np.save(paths["ids"], np.arange(200) % 70)  # ids up to 69, beyond a vocabulary of 64
    return paths


@pytest.mark.timeout(240)
def test_trains_like_the_model_in_one_process_and_saves_what_from_pretrained_loads(tmp_path, configs, forked_cli):
    from transformers import AutoModelForCausalLM

    from pipesched.training.launch_checks import activation_peaks, rank_state, stage_specs, state_slots
    from pipesched.training.optimizers import make_optimizer
    from pipesched.parallel_layout import ParallelLayout
    from pipesched.training.models import get_model

    data = tmp_path / "data.bytes"  # neither a token file nor text: its bytes are the token ids (modulo 64)
    data.write_bytes(bytes(range(256)) * 8)
    out = tmp_path / "saved"
    args = ["--model", f"hf:{configs['llama']}", "--data", str(data), "--steps", "3", "--batch-size", "8",
            "-m", "4", "--optimizer", "adamw", "--lr", "1e-3", "--summary", str(tmp_path / "run.json")]
    # sharded (each stage FSDP2-split over 2 ranks): --save-hf and the checkpoint gather the shards whole;
    # --rank-memory-limit at the bytes the layout is predicted to hold at most runs, a byte less is refused
    md, plan = get_model(f"hf:{configs['llama']}", data=str(data)), pipesched.build_schedule("zb-v", 2, 4)
    stages, slots = stage_specs(md, plan, None, 1), state_slots(make_optimizer("adamw", 1e-3))
    state = [sum(rank_state(plan, stages, ParallelLayout(2, dp_shard=2), slots, r).values()) for r in range(2)]
    activations = activation_peaks(md, plan, None, 8, 2, 0, None, torch.float32)
    total, top = max((state[r] + activations[r], r) for r in range(2))
    layout = [*args, "-s", "zb-v", "--ranks", "2", "--dp-shard", "2"]
    run, refused = concurrently(lambda extra: forked_cli("train", *layout, *extra, timeout=200), [
        ["--rank-memory-limit", f"{total:.0f}B", "--save-hf", str(out), "--checkpoint-dir", str(tmp_path / "ck")],
        ["--rank-memory-limit", f"{total - 1:.0f}B"]])
    assert run.returncode == 0, run.stderr
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert (f"holds up to {format_bytes(total)} per rank (pipeline rank {top}) with {format_bytes(activations[top])} "
            "of activations at the schedule's peak") in refused.stderr, refused.stderr
    # the activations predicted before launch, on fake tensors (masks from the batch's real
    # values: SDPA's causal kernel on grouped keys, as the run), are the run's own prediction to
    # the byte, and what it measured within the runtime's 5% check
    for rank in json.loads((tmp_path / "run.json").read_text())["memory"]:
        assert rank["predicted_peak_activation_bytes"] == activations[rank["rank"]], rank
        assert rank["measured_peak_activation_bytes"] == pytest.approx(activations[rank["rank"]], rel=0.05), rank
    assert checkpoint_names(tmp_path / "ck") == model_names(AutoModelForCausalLM.from_config(make_config("llama")))
    assert "W deferred 99." in run.stdout  # the share of the weight-gradient work the split backward deferred
    losses = json.loads((tmp_path / "run.json").read_text())["losses"]
    # the single-process model: the same blocks (block i seeded seed + i), the same batches
    model = md.sequential(0)
    # AdamW's default decay on the matrices only, not on biases and norms (as the transformers Trainer)
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": matrices}, {"params": rest, "weight_decay": 0.0}], lr=1e-3)
    want = []
    for step in range(3):
        x, y = md.batch(step, 8, 0)
        optimizer.zero_grad()
        loss = md.loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        want.append(loss.item())
    assert losses == pytest.approx(want, rel=1e-5)
    saved = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    x, _ = md.batch(7, 4, 0)
    with torch.no_grad():
        assert torch.allclose(saved(input_ids=x).logits, model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(240)
def test_advise_profiles_the_model_and_train_auto_trains_the_schedule_it_chooses(tmp_path, configs, forked_cli):
    """``advise --profile`` on a Llama config recommends a schedule and prints the command that
    trains it on that model; ``train -s auto --memory-limit 2`` on (tied) GPT-2 profiles, chooses
    the fastest schedule within the limit, trains and checkpoints the tied weight once, under its
    group's first name."""
    from test_cli_tables import check_uncut, run_at_80
    from transformers import AutoModelForCausalLM

    from pipesched.registry import schedule_names

    small = ["--batch-size", "8", "--profile-steps", "2"]
    advise = ["advise", "--profile", "--model", f"hf:{configs['llama']}", "-p", "2", *small]
    train = ["train", "-s", "auto", "--model", f"hf:{configs['gpt2']}", "--ranks", "2", "--steps", "2",
             "--batch-size", "8", "--memory-limit", "2", "--checkpoint-dir", str(tmp_path / "ck"),
             "--summary", str(tmp_path / "run.json")]
    advice, trained = concurrently(lambda run: run(), [  # independent: side by side
        lambda: run_at_80(*advise),  # the table at 80 columns, piped: nothing cut, times in ms
        lambda: forked_cli(*train, timeout=200),
    ])
    assert advice.returncode == 0, advice.stderr
    check_uncut(advice)
    assert " ms │" in advice.stdout
    said = " ".join(advice.stdout.split())  # rich wraps long lines
    recommended = re.search(r"Recommendation: (\S+) ", said).group(1)
    assert recommended in schedule_names()
    train_it = re.search(r"Train it: (pipesched train .*?--batch-size 8)", said).group(1)
    assert f"--model hf:{configs['llama']} " in train_it and f"--csv {recommended}.csv" in train_it
    assert trained.returncode == 0, trained.stderr
    summary = json.loads((tmp_path / "run.json").read_text())
    chosen = re.search(r"^auto: (\S+) ", trained.stderr, re.M).group(1)  # what it chose, and why
    assert "fastest schedule within the limit" in trained.stderr
    assert summary["schedule"] == chosen and len(summary["losses"]) == 2
    assert re.search(rf"^{chosen}: ranks=2 ", trained.stdout, re.M)  # the run's summary
    saved = checkpoint_names(tmp_path / "ck")
    assert saved == model_names(AutoModelForCausalLM.from_config(make_config("gpt2")))
    assert "transformer.wte.weight" in saved and "lm_head.weight" not in saved


def checkpoint_names(folder) -> set[str]:
    """The model's tensors a ``train --checkpoint-dir`` checkpoint holds (its newest step), by name."""
    from torch.distributed.checkpoint import FileSystemReader

    from pipesched.runtime.checkpoints.checkpoint import latest

    keys = FileSystemReader(str(latest(folder))).read_metadata().state_dict_metadata
    return {key.removeprefix("model.") for key in keys if key.startswith("model.")}


def model_names(model) -> set[str]:
    """``model``'s state-dict names, a tied weight once, under its first name."""
    seen, names = set(), set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            names.add(name)
    return names


@pytest.mark.timeout(180)
def test_bad_input_is_one_line_and_exit_2_before_any_rank_starts(configs):
    rows = [
        (["--model", f"hf:{configs['t5']}"], ["cannot split a 't5' model (transformers has no causal LM for it)",
                                             "whose twin check passes"]),
        (["--model", f"hf:{configs['llama']}", "-s", "zb-v", "--ranks", "4"], ["8 stages", "6 blocks"]),
        (["--model", f"hf:{configs['gpt2-dropout']}"], ["draws (attn_pdrop=0.1, resid_pdrop=0.1)", "hf.pipeline"]),
    ]
    results = concurrently(lambda row: run_cli("train", *row[0], "--steps", "1"), rows)
    for (args, fragments), result in zip(rows, results):
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("pipesched: error:"), (args, result.stderr)
        for fragment in fragments:
            assert fragment in lines[0], (args, lines[0])


def test_what_the_command_refuses_is_refused_by_the_model_it_builds(configs, tmp_path):
    """The rest of the refusals, raised where the command raises them (building the model)."""
    from pipesched import hf
    from pipesched.training.job.hf_model import hf_model_options
    from pipesched.errors import ConfigError
    from pipesched.training.models import get_model

    gpt2 = hf.init_model(make_config("gpt2"))
    gpt2.save_pretrained(tmp_path / "gpt2")  # weights of another config than Llama's
    llama = f"hf:{configs['llama']}"
    cases = [
        ((f"hf:{configs['bert']}",), {}, "cannot split BertLMHeadModel: it splits "),
        ((f"hf:{configs['broken']}",), {}, "cannot read the model config"),
        ((llama,), {"weights": str(configs["ids"].parent)}, "no [*].safetensors files"),
        ((llama,), {"weights": str(tmp_path / "gpt2")}, "does not match the config: it has no 'model.embed_tokens.weight'"),
        ((llama,), {"data": str(configs["ids"])}, "token ids must be in 0..63 .*found 0..69"),
        ((llama,), {"data": str(tmp_path / "missing.bin")}, "No such file"),
        (("hf:/no/such/config.json",), {}, "no model config at '/no/such/config.json'"),
    ]
    for args, options, message in cases:
        with pytest.raises(ConfigError, match=message):
            get_model(*args, **options)
    with pytest.raises(ConfigError, match="--save-hf only applies to --model hf:CONFIG.json"):
        hf_model_options("gpt", None, None, tmp_path)


@pytest.mark.timeout(240)
def test_the_docs_example_runs_as_pasted_under_torchrun(tmp_path):
    """docs/huggingface.md's example, under torchrun on 2 ranks: the losses it prints are the
    model's in one process, and the folder it saves loads with from_pretrained."""
    import subprocess
    import sys

    from conftest import ROOT, cli_env

    text = (ROOT / "docs" / "huggingface.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert len(code.strip().splitlines()) < 20
    (tmp_path / "example.py").write_text(code)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "example.py"],
                         capture_output=True, text=True, timeout=200, env=cli_env(), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    printed = [float(x) for x in re.findall(r"loss (\d+\.\d+)", run.stdout)]
    namespace: dict = {}
    single = code.replace('dist.init_process_group("gloo")', "").replace("ranks=dist.get_world_size()", "ranks=1")
    single = single.split("rt = hf.pipeline")[0]  # the model and the batch, built as the example builds them
    exec(single, namespace)
    model, batch = namespace["model"], namespace["batch"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    want = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        want.append(round(loss.item(), 4))
    assert printed == want
    from transformers import LlamaForCausalLM

    saved = LlamaForCausalLM.from_pretrained(tmp_path / "trained")
    from runtime_cases import relative_error

    # fp32 AdamW: an element whose gradient is near its rounding steps by that rounding, not by
    # the model (docs/huggingface.md, "fp32 and AdamW"); measured 1.4e-5 here
    assert relative_error(saved.state_dict(), model.state_dict()) < 1e-4


def test_weights_are_read_by_name_and_a_tied_head_from_its_embedding(configs, tmp_path):
    """A folder save_pretrained wrote (GPT-2's holds its tied head once, as the embedding) loads
    into the blocks built from the config, every entry equal."""
    from pipesched import hf
    from pipesched.training.models import get_model

    torch.manual_seed(3)
    gpt2 = hf.init_model(make_config("gpt2"), seed=3)
    gpt2.save_pretrained(tmp_path / "gpt2")
    md = get_model(f"hf:{configs['gpt2']}", weights=str(tmp_path / "gpt2"))
    assert md.tied == (("0.transformer.wte.weight", f"{md.num_blocks - 1}.lm_head.weight"),)
    loaded = {k.partition(".")[2]: v for k, v in md.sequential(0).state_dict().items()}
    assert loaded.keys() == gpt2.state_dict().keys()
    assert all(torch.equal(loaded[k], v) for k, v in gpt2.state_dict().items())


@pytest.mark.parametrize("kind", ["mixtral", "qwen3-moe"])
def test_moe_folders_transformers_wrote_load_by_its_own_conversion_and_save_back(kind, tmp_path):
    """transformers stores an MoE layer's experts one by one (Mixtral's ``experts.3.w1.weight``,
    Qwen's ``experts.3.gate_proj.weight``), sharded here with an index; the blocks built from the
    config read that folder through transformers' own conversion (the fused ``gate_up_proj`` it
    stacks and concatenates), give the logits ``from_pretrained`` gives, and what
    ``save_pretrained`` writes of them loads in transformers with the same logits."""
    from hf_cases import make_batch
    from transformers import AutoModelForCausalLM

    from pipesched import hf
    from pipesched.hf.saving import write_pretrained
    from pipesched.training.models import get_model

    config = make_config(kind)
    config.to_json_file(str(tmp_path / "config.json"))
    hf.init_model(config, seed=3).save_pretrained(tmp_path / "stored", max_shard_size="40KB")
    stored = {k for f in (tmp_path / "stored").glob("*.safetensors") for k in _safetensors_keys(f)}
    assert (tmp_path / "stored" / "model.safetensors.index.json").exists()
    assert not any("gate_up_proj" in k for k in stored) and any(".experts.3." in k for k in stored)
    md = get_model(f"hf:{tmp_path / 'config.json'}", weights=str(tmp_path / "stored"))
    blocks = md.sequential(0)
    ids = make_batch(0, 2, 16)["input_ids"]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "stored")
    with torch.no_grad():
        assert torch.equal(blocks(ids), loaded(input_ids=ids).logits)
        write_pretrained(config, {k.partition(".")[2]: v for k, v in blocks.state_dict().items()}, tmp_path / "again")
        again = AutoModelForCausalLM.from_pretrained(tmp_path / "again")
        assert torch.equal(again(input_ids=ids).logits, loaded(input_ids=ids).logits)


def _safetensors_keys(file) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        return list(f.keys())
