"""Hugging Face inputs bounded before any work (issue 31), through the console script: hostile
configs (sizes as text, floats, NaN, zero or negative; heads that do not divide; 10**9 layers; a
70-byte config asking for tens of GB; JSON nested 100k deep; unknown rope types), ``--data``
that is a device, a FIFO or empty, weights of integer or boolean dtype or stored twice,
``--save-hf`` into a folder holding other files or a place that refuses files. Each is refused
in one line, exit 2, in well under the 10 s bound, before any rank starts; the refusals run in
one process through the console script's entry point (:func:`fuzz_cases.run_batch`). Then two
runs that train: float64 weights are named as rounded, a previous save is replaced whole (no
stale shard, the usual file mode), and a save that fails after training is kept in a temporary
folder named in one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import numpy as np
from conftest import SRC, concurrently, run_cli
from fuzz_cases import run_batch

pytest.importorskip("transformers")
import torch  # noqa: E402
from hf_cases import make_config  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(240)]

HOOKS = Path(__file__).resolve().parent / "fault_hooks"
TRAIN = ["train", "-s", "none", "--steps", "1", "--batch-size", "4"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("configs") / "llama.json"
    make_config("llama").to_json_file(str(path))
    return path


def _config(folder: Path, name: str, llama: Path, **changes) -> Path:
    data = {**json.loads(llama.read_text()), **changes}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def _weights(folder: Path, change=None, split: bool = False) -> Path:
    """The Llama's weights as safetensors, ``change(state)`` applied; ``split``: in two files
    that both hold the embedding."""
    from safetensors.torch import save_file

    from pipesched import hf

    state = {k: v.contiguous() for k, v in hf.init_model(make_config("llama")).state_dict().items()}
    if change:
        change(state)
    folder.mkdir()
    if split:
        names = sorted(state)
        save_file({k: state[k] for k in names[: len(names) // 2]}, str(folder / "a.safetensors"))
        save_file({k: state[k] for k in ["model.embed_tokens.weight", *names[len(names) // 2:]]},
                  str(folder / "b.safetensors"))
    else:
        save_file(state, str(folder / "model.safetensors"))
    return folder


def test_hostile_configs_data_weights_and_save_folders_are_refused_in_one_line_at_once(llama, tmp_path):
    c = lambda name, **changes: f"hf:{_config(tmp_path, name, llama, **changes)}"  # noqa: E731
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "empty.bin").write_bytes(b"")
    os.mkfifo(tmp_path / "fifo.bin")
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    (full / "config.json").write_text("{}")
    cases = {
        "hidden as text": (["--model", c("a", hidden_size="32")], "hidden_size must be a whole number from 1"),
        "hidden NaN": (["--model", c("b", hidden_size=float("nan"))], "hidden_size must be a whole number"),
        "layers float": (["--model", c("c", num_hidden_layers=2.0)], "num_hidden_layers must be a whole number"),
        "heads": (["--model", c("d", num_attention_heads=5, num_key_value_heads=5, head_dim=None)], "hidden size 32 does not split into 5 attention heads"),
        "kv heads": (["--model", c("e", num_key_value_heads=3)], "4 attention heads do not split into 3"),
        "model_type list": (["--model", c("f", model_type=["llama"])], "model_type must be a name"),
        "vocab 0": (["--model", c("g", vocab_size=0)], "vocab_size must be from 1"),
        "vocab -1": (["--model", c("h", vocab_size=-1)], "vocab_size must be from 1"),
        "hidden 0": (["--model", c("i", hidden_size=0)], "hidden_size must be from 1"),
        "layers 0": (["--model", c("j", num_hidden_layers=0)], "num_hidden_layers must be from 1"),
        "layers -3": (["--model", c("k", num_hidden_layers=-3)], "num_hidden_layers must be from 1"),
        "layers 1e4": (["--model", c("l", num_hidden_layers=10**4)], "num_hidden_layers must be from 1 to 1024"),
        "layers 1e9": (["--model", c("m", num_hidden_layers=10**9)], "num_hidden_layers must be from 1 to 1024"),
        "rope type": (["--model", c("n", rope_parameters={"rope_type": "nope", "rope_theta": 1e4})], "KeyError"),
        "positions -5": (["--model", c("o", max_position_embeddings=-5)], "max_position_embeddings must be from 1"),
        "67 GB": (["--model", c("p", hidden_size=16384, intermediate_size=53248, num_attention_heads=128,
                                num_key_value_heads=8, num_hidden_layers=126)], "parameters need"),
        "nested 100k": (["--model", f"hf:{tmp_path / 'deep.json'}"], "nested too deep"),
        "data device": (["--model", f"hf:{llama}", "--data", "/dev/zero"], "is not a regular file"),
        "data fifo": (["--model", f"hf:{llama}", "--data", str(tmp_path / "fifo.bin")], "is not a regular file"),
        "data empty": (["--model", f"hf:{llama}", "--data", str(tmp_path / "empty.bin")], "0 tokens, too few"),
        "weights bool": (["--model", f"hf:{llama}", "--hf-weights", str(_weights(tmp_path / "wb", _as(torch.bool)))],
                         "is BOOL, not a floating-point tensor"),
        "weights int64": (["--model", f"hf:{llama}", "--hf-weights", str(_weights(tmp_path / "wi", _as(torch.int64)))],
                          "is I64, not a floating-point tensor"),
        "weights twice": (["--model", f"hf:{llama}", "--hf-weights", str(_weights(tmp_path / "wd", split=True))],
                          "'model.embed_tokens.weight' is stored twice"),
        "save into others": (["--model", f"hf:{llama}", "--save-hf", str(full)], "holds 'notes.txt', which is not"),
        "save read-only": (["--model", f"hf:{llama}", "--save-hf", "/proc/pipesched/out"], "does not accept new files"),
    }
    outcomes = run_batch([[*TRAIN, *args] for args, _ in cases.values()], tmp_path, bound_s=10,
                         warm=("torch", "transformers"))
    for (label, (_, why)), outcome in zip(cases.items(), outcomes):
        lines = outcome.stderr.strip().splitlines()
        assert outcome.code == 2 and len(lines) == 1 and not outcome.stdout, (label, outcome)
        assert lines[0].startswith("pipesched: error: ") and why in lines[0], (label, lines[0])
        assert outcome.seconds < 10, (label, outcome.seconds)
    assert sorted(p.name for p in full.iterdir()) == ["config.json", "notes.txt"]
    assert (full / "config.json").read_text() == "{}"


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


def test_hostile_text_tokenizers_end_of_sequence_ids_and_tp_splits_are_one_line_before_launch(
        llama, tmp_path, monkeypatch):
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
    c = lambda name, **changes: f"hf:{_config(tmp_path, name, llama, **changes)}"  # noqa: E731
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
    outcomes = run_batch([[*TRAIN, *args] for args, _ in cases.values()], tmp_path, bound_s=20,
                         warm=("torch", "transformers"))
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


def _as(dtype):
    def change(state):
        state["model.norm.weight"] = state["model.norm.weight"].to(dtype)
    return change


def test_a_save_replaces_a_previous_one_whole_and_one_that_fails_after_training_is_kept(llama, tmp_path):
    from transformers import AutoModelForCausalLM

    weights = _weights(tmp_path / "f64", lambda state: state.update({k: v.double() for k, v in state.items()}))
    previous = tmp_path / "previous"
    previous.mkdir()
    (previous / "config.json").write_text("{}")
    (previous / "model-00001-of-00002.safetensors").write_bytes(b"old shard")
    doomed = tmp_path / "doomed"
    doomed.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HOOKS), str(SRC)]), PIPESCHED_TEST_REMOVE_AFTER_RUN=str(doomed))
    replaced, lost = concurrently(lambda run: run(), [
        lambda: run_cli(*TRAIN, "--model", f"hf:{llama}", "--hf-weights", str(weights), "--save-hf", str(previous),
                        timeout=200),
        lambda: subprocess.run([sys.executable, "-m", "pipesched", *TRAIN, "--model", f"hf:{llama}",
                                "--save-hf", str(doomed / "out")], capture_output=True, text=True, env=env, timeout=200),
    ], workers=2)
    assert replaced.returncode == 0, replaced.stderr
    from safetensors import safe_open

    with safe_open(str(weights / "model.safetensors"), framework="pt") as f:
        stored = len(list(f.keys()))
    assert (f"pipesched: --hf-weights: 'lm_head.weight' and {stored - 1} more are float64, read into float32 weights "
            "(rounded to float32's precision)") in replaced.stderr.splitlines()
    assert sorted(p.name for p in previous.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    umask = os.umask(0)
    os.umask(umask)
    assert all((p.stat().st_mode & 0o777) == 0o666 & ~umask for p in previous.iterdir())
    AutoModelForCausalLM.from_pretrained(previous)
    assert lost.returncode == 1 and "Traceback" not in lost.stderr, lost.stderr
    last = lost.stderr.strip().splitlines()[-1]
    assert last.startswith(f"pipesched: error: the run finished, but could not write --save-hf {doomed / 'out'} "
                           "(No such file or directory): kept in "), last
    kept = Path(last.split("kept in ")[1].removesuffix(" instead"))
    assert kept.name.startswith("pipesched-save-hf-") and (kept / "model.safetensors").is_file()
    AutoModelForCausalLM.from_pretrained(kept)
    import shutil

    shutil.rmtree(kept)


def test_data_is_mapped_not_copied(tmp_path):
    """A 64 MiB --data file: the tokens of a batch are read without growing memory by the file's
    size (reading, copying and widening it to int64 took 18 times it)."""
    data = tmp_path / "big.bytes"  # no tokenizer, not a token file: its bytes are the tokens
    data.write_bytes(os.urandom(1 << 20) * 64)
    probe = (
        "import resource, sys; from pipesched.hf.cli_model import token_stream; import numpy as np\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"stream = token_stream({str(data)!r}, 50000)\n"
        "ids = stream.take(np.array([0, len(stream) - 65]), 64)\n"
        "assert len(stream) == 64 << 20 and ids.shape == (2, 64) and int(ids.max()) < 256\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(SRC))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    grown_kib = int(done.stdout)
    assert grown_kib < 16 << 10, grown_kib  # KiB: a quarter of the file; copying it once would be 64 MiB


def test_transformers_warnings_stay_out_of_the_terminal_unless_verbose():
    """Every rank imports transformers: its warnings would print once per process."""
    probe = ("from pipesched.hf.config_file import quiet_transformers; quiet_transformers()\n"
             "from transformers.utils import logging; logging.get_logger('transformers.models.llama').warning('loud')\n")
    said = {}
    for verbose in ("0", "1"):
        env = dict(os.environ, PYTHONPATH=str(SRC), PIPESCHED_VERBOSE=verbose)
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        said[verbose] = done.stderr
    assert said["0"] == "" and said["1"].strip().endswith("loud")  # transformers may prefix its name


def test_the_parameter_count_from_two_small_builds_is_the_whole_models():
    from transformers import AutoConfig

    from pipesched.hf.build import init_model, meta_model
    from pipesched.hf.config_checks import parameter_count

    for kind in ("llama", "gpt2", "qwen3", "mixtral"):
        data = {k: v for k, v in make_config(kind).to_dict().items() if k != "layer_types"}
        data["n_layer" if kind == "gpt2" else "num_hidden_layers"] = 5
        whole = init_model(AutoConfig.for_model(**data))
        held = sum(p.numel() for p in {id(p): p for p in whole.parameters()}.values())  # a tied weight once
        predicted = parameter_count(data, 5, lambda d: meta_model(AutoConfig.for_model(**d)))
        assert predicted == held, kind


def test_a_window_of_0_that_its_flag_turns_off_is_accepted_and_a_used_one_refused():
    from pipesched.errors import ConfigError
    from pipesched.hf.config_checks import check_sizes

    data = make_config("qwen2-moe").to_dict()  # transformers writes sliding_window 0 when unused
    assert data["sliding_window"] == 0 and data["use_sliding_window"] is False
    check_sizes(data, "qwen2-moe")
    with pytest.raises(ConfigError, match="sliding_window must be from 1"):
        check_sizes({**data, "use_sliding_window": True}, "qwen2-moe")
