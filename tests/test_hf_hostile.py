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
