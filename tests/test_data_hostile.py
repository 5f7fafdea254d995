"""Hostile text data, tokenizers and token caches (issue 39's red-team pass), through the
console script: tokenizer files that are JSON but no tokenizer's, nested 100k deep, a FIFO or a
link to ``/dev/zero``; ``.jsonl`` lines with a lone surrogate or nested 100k deep; end-of-sequence
ids no token can match under ``--packing documents``; a ``--tp`` that divides the heads but not
``intermediate_size``; a token cache under a file or on a full disk. Each was a traceback (or,
for the end-of-sequence ids, a run with no document boundary, silently); each is one line,
exit 2, before any rank starts, the refusals in one process (:func:`fuzz_cases.run_batch`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import SRC, concurrently
from fuzz_cases import run_batch

pytest.importorskip("transformers")
from hf_cases import make_config  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(240)]

TRAIN = ["train", "-s", "none", "--steps", "1", "--batch-size", "4"]


def _config(folder: Path, name: str, **changes) -> str:
    """``--model`` for a tiny Llama's config with ``changes``, written into ``folder``."""
    path = folder / f"{name}.json"
    make_config("llama", **changes).to_json_file(str(path))
    return f"hf:{path}"


def _tokenizer_folder(root: Path, name: str, tokenizer) -> Path:
    """A copy of ``root``'s model folder whose tokenizer.json is ``tokenizer`` (text to write, or a
    function making it in place: a FIFO, a link)."""
    folder = root / name
    folder.mkdir()
    for file in ("config.json", "tokenizer_config.json"):
        (folder / file).write_bytes((root / "model" / file).read_bytes())
    if callable(tokenizer):
        tokenizer(folder / "tokenizer.json")
    else:
        (folder / "tokenizer.json").write_text(tokenizer)
    return folder


def test_hostile_text_tokenizers_end_of_sequence_ids_and_tp_splits_are_one_line_before_launch(tmp_path, monkeypatch):
    """Each once a traceback (or, for the end-of-sequence ids, a run with no document boundary,
    silently): refused in one line, exit 2, before any rank starts."""
    from tokenizer_cases import model_folder, write_jsonl

    monkeypatch.setenv("PIPESCHED_CACHE_DIR", str(tmp_path / "cache"))
    model_folder(tmp_path / "model")
    whole = json.loads((tmp_path / "model" / "tokenizer.json").read_text())
    folders = {
        "empty": _tokenizer_folder(tmp_path, "empty", "{}"),
        "extra key": _tokenizer_folder(tmp_path, "extra", json.dumps({**whole, "extra": 1})),
        "deep": _tokenizer_folder(tmp_path, "deep", "[" * 100_000 + "]" * 100_000),
        "fifo": _tokenizer_folder(tmp_path, "fifo", os.mkfifo),
        "zero": _tokenizer_folder(tmp_path, "zero", lambda path: path.symlink_to("/dev/zero")),
    }
    docs = write_jsonl(tmp_path / "docs.jsonl", ["a few words", "and a few more"])
    surrogate = tmp_path / "surrogate.jsonl"
    surrogate.write_text('{"text": "fine"}\n{"text": "half \\ud800 a pair"}\n')
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    ids = tmp_path / "ids.npy"
    np.save(ids, np.arange(4096) % 60)
    c = lambda name, **changes: _config(tmp_path, name, **changes)  # noqa: E731
    packed = ["--data", str(ids), "--packing", "documents"]
    tp = ["-s", "1f1b", "--ranks", "1", "--tp", "2", "-m", "2"]
    cases = {
        **{label: (["--model", f"hf:{folder}", "--data", str(docs)], f"the tokenizer in {str(folder)!r} cannot be loaded")
           for label, folder in list(folders.items())[:3]},
        "fifo": (["--model", f"hf:{folders['fifo']}", "--data", str(docs)],
                 f"the tokenizer {str(folders['fifo'] / 'tokenizer.json')!r} is not a regular file (a FIFO, a device"),
        "zero": (["--model", f"hf:{folders['zero']}", "--data", str(docs)],
                 f"the tokenizer {str(folders['zero'] / 'tokenizer.json')!r} is not a regular file (a FIFO, a device"),
        "surrogate": (["--model", f"hf:{tmp_path / 'model'}", "--data", str(surrogate)],
                      "line 2's text holds '\\ud800', a lone surrogate"),
        "deep jsonl": (["--model", f"hf:{tmp_path / 'model'}", "--data", str(deep)], "line 1 is JSON nested too deep"),
        "eos []": (["--model", c("eos0", eos_token_id=[]), *packed], "the config's eos_token_id is an empty list, which "
                   "matches no token id of the vocabulary (0 to 63): no document would ever end"),
        "eos -1": (["--model", c("eos1", eos_token_id=-1), *packed], "eos_token_id holds -1, which matches no token id"),
        "eos 64": (["--model", c("eos2", eos_token_id=[2, 64]), *packed], "eos_token_id holds 64, which matches no"),
        "tp mlp": (["--model", c("tp", intermediate_size=37), *tp], "tp=2 does not divide the 37 rows of "
                   "model.layers.0.mlp.gate_proj.weight (shape [37, 32]), which tensor parallelism splits"),
    }
    warm = ("torch", "transformers", "transformers.models.auto.tokenization_auto", "transformers.tokenization_utils_fast",
            "transformers.models.llama.modeling_llama", "pipesched.hf.cli_model")  # seconds of imports, not the cases'
    outcomes = run_batch([[*TRAIN, *args] for args, _ in cases.values()], tmp_path, bound_s=20, warm=warm)
    for (label, (_, why)), outcome in zip(cases.items(), outcomes):
        lines = outcome.stderr.strip().splitlines()
        assert outcome.code == 2 and len(lines) == 1 and not outcome.stdout, (label, outcome)
        assert lines[0].startswith("pipesched: error: ") and why in lines[0], (label, lines[0])
    assert "its files lack the key" in outcomes[0].stderr


def test_a_token_cache_that_cannot_be_written_is_one_line_and_leaves_no_partial_file(tmp_path):
    """The cache path under a file, and a disk that fills (RLIMIT_FSIZE: each write past the
    limit fails with EFBIG, as ENOSPC would): one line through the console script, nothing left
    in the cache; a partial file a killed tokenization left is removed by the next one."""
    import resource

    from tokenizer_cases import model_folder, shipped_documents, write_jsonl

    folder = model_folder(tmp_path / "model")
    docs = write_jsonl(tmp_path / "docs.jsonl", shipped_documents())
    (tmp_path / "file").write_text("a file, not a folder")
    full = tmp_path / "full"
    full.mkdir()
    abandoned = full / ".tokens-0.bin.999999999.partial"  # no process has that id (above pid_max)
    abandoned.write_bytes(b"left by a killed run")

    def run(cache: Path, limit: int = resource.RLIM_INFINITY) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=str(SRC), PIPESCHED_CACHE_DIR=str(cache),
                   PYTHONDONTWRITEBYTECODE="1")  # under the limit, Python's own .pyc writes would be cut short
        return subprocess.run([str(Path(sys.executable).with_name("pipesched")), *TRAIN, "--model", f"hf:{folder}",
                               "--data", str(docs)], capture_output=True, text=True, env=env, timeout=120,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))

    blocked, filled = concurrently(lambda args: run(*args), [(tmp_path / "file" / "cache",), (full, 1024)], workers=2)
    for result, why in ((blocked, "(Not a directory)"), (filled, "(File too large)")):
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert lines[0].startswith(f"pipesched: error: --data {str(docs)!r}: cannot write its tokens to ")
        assert lines[0].endswith(f" {why}: set PIPESCHED_CACHE_DIR to a writable folder with room"), lines[0]
    assert list(full.iterdir()) == []  # the failed write's partial file and the abandoned one are gone
    assert (tmp_path / "file").read_text() == "a file, not a folder"
