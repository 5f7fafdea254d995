"""Which Hugging Face families train exactly under tensor parallelism with their plans
(``runtime/sharding/model_plans.py``: each config's declared ``base_model_tp_plan`` and pipesched's
overrides).

For each family (a tiny random config, ``tests/hf_cases.make_config``: DeepSeek-V3, Qwen2-MoE and
the q/k-norm families their real configs shrunk; ``helium``: a Llama-like with no entry of its own
in pipesched; Qwen2 and Mistral built here; ``cohere-qk``: Cohere with its per-head q/k norms),
two runs through the console script, side by side:
``train --ranks 2 --tp 2 -s 1f1b`` (4 processes) and the one-process reference (``-s none``),
3 SGD steps at lr 0.05 in fp32 on the same batches. Prints the largest relative difference of the
losses and of the final weights (each tensor's largest difference over its largest entry);
``--check`` exits 1 if either is over 1e-5 (fp32 sums in another order across the ``tp`` ranks and
the microbatches: a few ulps of each product, well under 1e-5 at this size). A family whose plan
does not fit is refused by ``train`` in one line (``model_plans.plan_for``: a config that declares
no plan, or a style pipesched cannot apply); this script is how an override earns its place.

    PYTHONPATH=src:tests python benchmarks/tp_families.py [--check] [--families gemma,granite]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

FAMILIES = ["llama", "helium", "mistral", "qwen2", "gemma", "gemma2", "granite", "starcoder2", "mixtral", "deepseek-v3", "qwen2-moe",
            "qwen3", "qwen3-moe", "gemma3", "cohere", "cohere-qk", "olmo2", "gpt-neox", "falcon", "falcon-grouped", "phi3",
            "phi3-gqa", "gpt2"]
BOUND = 1e-5
COMMON = ["--batch-size", "8", "--steps", "3", "--lr", "0.05", "--optimizer", "sgd"]


def config(kind: str):
    """A tiny random-init config of ``kind``."""
    import transformers as tf
    from hf_cases import make_config

    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=32, use_cache=False)
    if kind == "qwen2":
        return tf.Qwen2Config(**small)
    if kind == "mistral":
        return tf.MistralConfig(**small, sliding_window=4)
    return make_config(kind)


def train(folder: Path, kind: str, name: str, args: list[str]) -> tuple[list[float], dict]:
    """One ``pipesched train`` run: its losses and final weights."""
    summary, params = folder / f"{kind}-{name}.json", folder / f"{kind}-{name}.pt"
    done = subprocess.run([sys.executable, "-m", "pipesched", "train", "--model", f"hf:{folder / kind}.json", *COMMON,
                           *args, "--summary", str(summary), "--save-params", str(params)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"{kind} {name}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(summary.read_text())["losses"], torch.load(params, weights_only=True)


def compare(folder: Path, kind: str) -> tuple[float, float]:
    """(losses, weights): the largest relative difference of the tp run from the reference."""
    config(kind).to_json_file(folder / f"{kind}.json")
    with ThreadPoolExecutor(2) as pool:
        split = pool.submit(train, folder, kind, "tp", ["--ranks", "2", "--tp", "2", "-s", "1f1b"])
        whole = pool.submit(train, folder, kind, "one", ["-s", "none"])
        (got_losses, got), (want_losses, want) = split.result(), whole.result()
    losses = max(abs(a - b) / abs(b) for a, b in zip(got_losses, want_losses))
    weights = max(float((got[k] - want[k]).abs().max() / want[k].abs().max()) for k in want)
    return losses, weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help=f"exit 1 if a family is over {BOUND:g}")
    parser.add_argument("--families", default=",".join(FAMILIES))
    args = parser.parse_args()
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.families.split(","):
            losses, weights = compare(Path(tmp), kind)
            worst = max(worst, losses, weights)
            print(f"{kind:15s} losses {losses:.1e}  weights {weights:.1e}", flush=True)
    if args.check and worst > BOUND:
        raise SystemExit(f"over {BOUND:g}: {worst:.1e}")


if __name__ == "__main__":
    main()
