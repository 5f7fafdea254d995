"""Generated hostile Hugging Face configs and checkpoint manifests (issue 31), from a seed.

A config starts as a tiny valid one of a splittable family and gets a few mutations: a size
field set to a value of the wrong type or out of range (text, a float, NaN, infinity, a bool,
zero, negative, 10**9, 2**63, a list), a size that asks for more memory than there is, a
``model_type`` that is not a name or not a family, rope parameters, an activation or an
attention implementation transformers does not know, a value nested deep, a field removed. Most
are refused by the size checks in milliseconds; a few reach transformers' own checks or the
meta build; the few left valid train one step in one process (``-s none``), tiny by design.

A manifest is a real one (of a step folder whose files are bytes, not DCP's: ``checkpoint
verify`` checks sizes and digests only) with an entry, a field or the whole text replaced by
something hostile: names outside the folder or of devices, FIFOs and links, wrong types, deep
nesting, bytes that are not UTF-8.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32, use_cache=False)
FAMILIES = {
    "llama": TINY, "mistral": TINY, "qwen2": TINY,
    "qwen3": {**TINY, "head_dim": 8},
    "mixtral": {**TINY, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {**TINY, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    "gpt2": dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32, use_cache=False),
}
HOSTILE_SIZES = ["32", 32.5, 2.0, float("nan"), float("inf"), -float("inf"), True, False, 0, -1, -3, 10**4, 10**9,
                 2**63, 10**30, [], {}, [32], "", "0x20"]
HOSTILE_OTHER = [
    ("model_type", ["llama"]), ("model_type", 5), ("model_type", "bert"), ("model_type", ""), ("model_type", None),
    ("rope_parameters", {"rope_type": "nope", "rope_theta": 1e4}), ("rope_parameters", "linear"),
    ("rope_parameters", {"rope_type": "linear"}), ("hidden_act", "nope"), ("hidden_act", 3),
    ("attn_implementation", "nope"), ("tie_word_embeddings", "yes"), ("rms_norm_eps", "tiny"),
    ("initializer_range", [1]), ("layer_types", ["nope"]), ("sliding_window", -4),
]
DEEP = "deeply nested"
MEMORY_HOG = {"hidden_size": 1 << 16, "n_embd": 1 << 16, "intermediate_size": 1 << 20, "vocab_size": 1 << 24}


def _deep(depth: int):
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def config_case(rng: random.Random) -> dict:
    """One generated config (a dict to write as JSON; NaN and infinity as JSON's extensions)."""
    family = rng.choice(sorted(FAMILIES))
    data = {"model_type": family, **FAMILIES[family]}
    roll = rng.random()
    if roll < 0.03:  # left valid: it trains
        return data
    sizes = [k for k in data if k not in ("model_type", "use_cache")]
    if roll < 0.85:
        for _ in range(rng.randint(1, 3)):
            data[rng.choice(sizes)] = rng.choice(HOSTILE_SIZES)
    elif roll < 0.90:
        data.update({k: v for k, v in MEMORY_HOG.items() if k in data})
    elif roll < 0.93:
        data[rng.choice(sizes)] = DEEP  # written as lists nested 100,000 deep
    elif roll < 0.96:
        del data[rng.choice(sizes)]  # a default of the family: large, but on meta only
        data.update({k: v for k, v in MEMORY_HOG.items() if k in data})
    else:
        key, value = rng.choice(HOSTILE_OTHER)
        data[key] = value
    return data


def config_cases(count: int, seed: int, folder: Path) -> list[list[str]]:
    """``count`` configs written into ``folder``; a ``train`` command for each."""
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        path = folder / f"config-{i}.json"
        path.write_text(json.dumps(config_case(rng)).replace(json.dumps(DEEP), "[" * 100_000 + "]" * 100_000))
        cases.append(["train", "--model", f"hf:{path}", "-s", "none", "--steps", "1", "--batch-size", "2"])
    return cases


def step_folder(folder: Path) -> Path:
    """A step folder with two files and its manifest (written as pipesched writes it)."""
    from pipesched.runtime.checkpoints.checkpoint_manifest import write_manifest

    step = folder / "step-000003"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(b"metadata")
    (step / "__0_0.distcp").write_bytes(os.urandom(64))
    write_manifest(step, 3)
    return step


HOSTILE_NAMES = ["/dev/zero", "/etc/passwd", "../../x", "..", ".", "", "a/b", "a\0b", "fifo", "link", "dir",
                 "manifest.json", "\udcff", "x" * 5000]
HOSTILE_VALUES = [None, 1, "2", [1, 2], {}, {"bytes": "8"}, {"bytes": 8}, {"bytes": -1, "sha256": "0" * 64},
                  {"bytes": 2**70, "sha256": "0" * 64}, {"bytes": 8, "sha256": "zz"}, {"bytes": 8.0, "sha256": "0" * 64},
                  {"bytes": True, "sha256": "0" * 64}]


def manifest_case(rng: random.Random, manifest: dict) -> str:
    """``manifest`` made hostile in one of several ways (the text to write)."""
    files = dict(manifest["files"])
    roll = rng.random()
    if roll < 0.35 or roll >= 0.95:
        files[rng.choice(HOSTILE_NAMES)] = {"bytes": 8, "sha256": "0" * 64}
    elif roll < 0.6:
        files[rng.choice(sorted(files))] = rng.choice(HOSTILE_VALUES)
    elif roll < 0.75:
        return json.dumps({**manifest, rng.choice(["step", "files", "format"]): rng.choice(HOSTILE_VALUES + [_deep(50)])})
    elif roll < 0.85:
        depth = rng.choice([1000, 100_000])
        return "[" * depth + "]" * depth
    elif roll < 0.95:
        return rng.choice(["", "{", "null", "[]", '{"files": {}}', "\udcff\udcfe", json.dumps(manifest)[:-3]])
    return json.dumps({**manifest, "files": files}, ensure_ascii=rng.random() < 0.5)


def manifest_cases(count: int, seed: int, folder: Path) -> list[list[str]]:
    """``count`` checkpoint folders, each one step with a hostile manifest; a ``checkpoint
    verify`` command for each."""
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        step = step_folder(folder / f"ck-{i}")
        manifest = json.loads((step / "manifest.json").read_text())
        text = manifest_case(rng, manifest)
        (step / "manifest.json").write_bytes(text.encode("utf-8", "surrogateescape"))
        os.mkfifo(step / "fifo")
        (step / "link").symlink_to("/dev/zero")
        (step / "dir").mkdir()
        cases.append(["checkpoint", "verify", str(step.parent)])
    return cases
