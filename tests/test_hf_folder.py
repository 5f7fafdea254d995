"""``pipesched train --model hf:FOLDER`` through the console script: a Hugging Face folder is a
whole model. The run takes the folder's config, the tokenizer beside it and its weights, and says
which in one line (a folder with no weights: that it initialises them); ``--save-hf`` writes the
tokenizer beside the trained model, so transformers loads the folder whole and generates."""

from __future__ import annotations

import json

import pytest
from conftest import concurrently

pytest.importorskip("transformers")
import torch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """``whole``: config, tokenizer (tests/tokenizer_cases.py) and weights (a model initialised
    here, not as pipesched initialises); ``bare``: the same config and tokenizer, no weights; and
    text documents as .jsonl."""
    from tokenizer_cases import model_folder, shipped_documents, write_jsonl
    from transformers import AutoConfig, AutoModelForCausalLM

    monkeypatch.setenv("PIPESCHED_CACHE_DIR", str(tmp_path / "cache"))  # the tokenized stream
    whole, bare = model_folder(tmp_path / "whole"), model_folder(tmp_path / "bare")
    torch.manual_seed(1234)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(whole))).save_pretrained(str(whole))
    return whole, bare, write_jsonl(tmp_path / "docs.jsonl", shipped_documents())


def test_a_folder_gives_its_config_tokenizer_and_weights_and_saves_what_transformers_loads_whole(tmp_path, folders, forked_cli):
    from tokenizer_cases import shipped_documents
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipesched.training.models import get_model

    whole, bare, data = folders
    common = ["train", "-s", "none", "--data", str(data), "--batch-size", "4", "--lr", "0.01", "--optimizer", "sgd"]
    from safetensors.torch import save_file
    from tokenizer_cases import model_folder

    hostile = model_folder(tmp_path / "hostile")  # its weights file holds a bool tensor
    save_file({"lm_head.weight": torch.zeros(2, 2, dtype=torch.bool)}, str(hostile / "model.safetensors"))
    runs = [[*common, "--model", f"hf:{whole}", "--steps", "2", "--summary", str(tmp_path / "whole.json"),
             "--save-hf", str(tmp_path / "saved")],
            [*common, "--model", f"hf:{bare}", "--steps", "1"],
            [*common, "--model", f"hf:{bare}", "--steps", "1", "--hf-weights", str(whole)],
            [*common, "--model", f"hf:{hostile}", "--steps", "1"]]
    with_weights, without, given, refused = concurrently(lambda args: forked_cli(*args, timeout=300), runs, workers=3)
    for done in (with_weights, without, given):
        assert done.returncode == 0, done.stderr
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"pipesched: error: the weights of hf:{hostile}: 'lm_head.weight' in {hostile / 'model.safetensors'} is BOOL, "
        "not a floating-point tensor: a weight cannot be read from it"], refused.stderr
    said = {done: [line for line in done.stderr.splitlines() if line.startswith("pipesched: hf:")]
            for done in (with_weights, without, given)}
    assert said[with_weights] == [f"pipesched: hf:{whole}: its config, its tokenizer and its weights "
                                  "(1 safetensors file(s))"]
    assert said[without] == [f"pipesched: hf:{bare}: its config, its tokenizer and no weights, "
                             "so it initialises them at random"]
    assert said[given] == [f"pipesched: hf:{bare}: its config, its tokenizer and the weights of {str(whole)!r}"]

    # the first step's loss is that of the folder's weights on the first batch, read through its
    # tokenizer: the same fp32 model on the same ids, its sums in the same order but for the
    # blocks run one by one (a few ulps of a loss near 4; another model's loss differs by 1e-2 and more)
    md = get_model(f"hf:{whole}", data=str(data), weights=str(whole))
    ids, labels = md.batch(0, 4, 0)
    model = AutoModelForCausalLM.from_pretrained(str(whole))
    with torch.no_grad():
        first = model(input_ids=ids, labels=labels).loss.item()
    losses = json.loads((tmp_path / "whole.json").read_text())["losses"]
    assert losses[0] == pytest.approx(first, rel=1e-5)

    saved = tmp_path / "saved"
    assert (saved / "tokenizer.json").is_file() and (saved / "tokenizer_config.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(str(saved), local_files_only=True)
    text = shipped_documents()[0]
    prompt = tokenizer(text, return_tensors="pt").input_ids
    assert prompt[0].tolist() == AutoTokenizer.from_pretrained(str(whole))(text).input_ids
    trained = AutoModelForCausalLM.from_pretrained(str(saved), local_files_only=True)
    out = trained.generate(prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape == (1, prompt.shape[1] + 3) and torch.equal(out[:, :prompt.shape[1]], prompt)
