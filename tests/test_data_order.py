"""docs/training.md's data order, rebuilt as the doc says: its numpy recipe (run from the page
itself) draws the windows ``train_windows`` draws, on streams either side of the size where
torch changes how it draws an offset, and the windows a tokenized run's ranks read at a step."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT

def documented_step_batch():
    """``step_batch``, the recipe docs/training.md gives for rebuilding a step's windows."""
    text = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    recipe = next(block for block in text.split("```python\n")[1:] if "def step_batch" in block).split("```")[0]
    scope: dict = {}
    exec(compile(recipe, "docs/training.md", "exec"), scope)
    return scope["step_batch"]


class Positions:
    """A stream of ``n`` ids whose id at each position is the position (held as nothing): a
    window read from it shows where it starts, whatever ``n`` is."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key):
        return np.arange(key.start, key.stop) if isinstance(key, slice) else np.asarray(key)


@pytest.mark.torch
@pytest.mark.parametrize("length", [1000, 2**28 - 1, 2**28 + 64, 3 * 2**32])
def test_the_documented_recipe_draws_the_windows_train_draws(length):
    """Streams on both sides of 2^28 tokens, where torch changes how it draws an offset."""
    pytest.importorskip("torch")
    from pipesched.data.streams import TokenStream, train_windows

    step_batch = documented_step_batch()
    for step, seed in ((0, 0), (7, 5), (2, 2**32 - 1)):
        got = train_windows(TokenStream(Positions(length)), step, 16, seed, 32).numpy()
        assert np.array_equal(step_batch(Positions(length), step, 16, seed, 32), got)


@pytest.mark.torch
def test_a_step_of_a_tokenized_run_is_rebuilt_from_the_docs_recipe(tmp_path, monkeypatch):
    """The batch a run's ranks read at step index 3 (``ModelDef.batch``, what every rank calls) of
    a .jsonl through the model folder's tokenizer, 5% held out, is the recipe's on the stream the
    doc names: the tokenized ids, the first N - int(0.05 N) of them, windows of the default
    --seq-len (the model's 32 positions)."""
    pytest.importorskip("tokenizers")
    from tokenizer_cases import VOCAB, model_folder, shipped_documents, write_jsonl

    from pipesched.hf.cli_model import hf_model_def, token_stream

    monkeypatch.setenv("PIPESCHED_CACHE_DIR", str(tmp_path / "cache"))  # the tokenized stream: not the user's cache
    folder = model_folder(tmp_path / "model")
    data = str(write_jsonl(tmp_path / "docs.jsonl", shipped_documents() * 4))
    run = hf_model_def(str(folder / "config.json"), data=data, eval_share=0.05)
    ids = token_stream(data, VOCAB, str(folder)).ids
    kept = ids[: len(ids) - int(len(ids) * 0.05)]
    inputs_, labels = run.batch(3, 8, 11)
    want = documented_step_batch()(kept, 3, 8, 11, 32)
    assert np.array_equal(inputs_.numpy(), want) and np.array_equal(labels.numpy(), want)
