"""How good is the advisor's pick on real ranks? Profile, advise, then measure every candidate.

For each model (train's mlp and gpt; llama: a tiny Hugging Face Llama, width 128 and 4 layers,
its config written to a temporary folder by this script, trained as ``--model hf:CONFIG.json``):
``advise --profile`` (the library calls behind it: profile the model with ZB-H1 on
2 local CPU ranks, then rank every schedule under the measured costs and a memory limit in M_B),
then run every distinct candidate the advice ranked as fitting, on the same 2 ranks, and take
its median step. Reports, per model, whether the pick's measured step is within 5% of the fastest
measured, and the Spearman rank correlation between the predicted makespans and the measured
steps. A shared machine's noise is real here: the candidates are measured in ``--rounds`` rounds,
each running every candidate once (so drift hits them alike), and each candidate's figure is its
median over the rounds; the spread (largest over smallest round) is printed with it.

    PYTHONPATH=src python benchmarks/advise_accuracy.py [--models mlp,gpt,llama] [--steps 6] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from pipesched.advise.search import objective_option
from pipesched.registry import build_schedule, get_family
from pipesched.runtime.copies import balanced_block_counts
from pipesched.runtime.launch import DistributedRunError
from pipesched.runtime.models import get_model
from pipesched.runtime.profile import advise_from_profile, profile
from pipesched.runtime.train import TrainConfig, run

RANKS, MICROBATCHES, BATCH, LIMIT = 2, 8, 64, 2.0  # the docs' example: advise --profile -p 2 -m 8 --memory-limit 2
NEAR = 0.05


def measured_step(model: str, c, steps: int) -> float:
    """The candidate's median step (seconds) on RANKS local ranks, the first step left out."""
    schedule = build_schedule(c.schedule, RANKS, c.microbatches, c.chunks, c.costs, c.memory_limit,
                              **objective_option(get_family(c.schedule), c.objective or "makespan"))
    blocks = tuple(balanced_block_counts(get_model(model).block_costs, schedule))
    config = TrainConfig(model, schedule, steps, BATCH, block_counts=blocks,
                         recompute="all" if c.recompute != "none" else None)
    try:
        return run(config).median_step_time()
    except DistributedRunError:  # on a shared machine another job may take the rendezvous port: once more
        return run(config).median_step_time()


def llama_config(folder: Path) -> str:
    """A tiny random-init Llama's config, written to ``folder`` (nothing is downloaded): the model
    name ``hf:CONFIG.json`` that train, profile and advise take."""
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
    path = folder / "llama.json"
    config.to_json_file(str(path))
    return f"hf:{path}"


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        for r, i in enumerate(order):
            out[i] = float(r)
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,gpt,llama",
                        help="mlp, gpt (train's models), llama (a tiny Hugging Face Llama)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            model = llama_config(Path(folder)) if name == "llama" else name
            measure(model, name, args.steps, args.rounds)


def measure(model: str, name: str, steps: int, rounds: int) -> None:
    """Profile and advise ``model``, measure every distinct candidate that fits in ``rounds``
    rounds of ``steps`` steps, and print its table under ``name``."""
    prof = profile(model, RANKS, MICROBATCHES, BATCH)
    advice = advise_from_profile(prof, LIMIT)
    seen, ranked = set(), []
    for c in advice.fitting:
        key = (c.schedule, c.chunks, c.microbatches, c.recompute)
        if key not in seen:
            seen.add(key)
            ranked.append(c)
    per = list(zip(*[[measured_step(model, c, steps) for c in ranked] for _ in range(rounds)]))
    medians = [statistics.median(times) for times in per]
    print(f"\n{name}: {len(ranked)} candidates that fit (p={RANKS}, m={MICROBATCHES}, limit {LIMIT:g} M_B), "
          f"{rounds} rounds of {steps} steps")
    print("| # | candidate | predicted ms | measured ms (median) | spread |")
    print("|---|---|---|---|---|")
    for i, (c, t, times) in enumerate(zip(ranked, medians, per)):
        print(f"| {i + 1} | {c.label()} | {c.makespan:.2f} | {1e3 * t:.2f} | {max(times) / min(times):.2f}x |")
    fastest = min(medians)
    pick = medians[0]
    print(f"pick {ranked[0].label()}: {1e3 * pick:.2f} ms; fastest measured "
          f"{ranked[medians.index(fastest)].label()}: {1e3 * fastest:.2f} ms; pick / fastest = {pick / fastest:.3f} "
          f"({'within' if pick <= (1 + NEAR) * fastest else 'NOT within'} 5%); "
          f"Spearman(predicted, measured) = {spearman([c.makespan for c in ranked], medians):.2f}")


if __name__ == "__main__":
    main()
