"""How good is the advisor's pick on real ranks? Profile, advise, then measure every candidate.

For each model: ``advise --profile`` (the library calls behind it: profile the model with ZB-H1 on
2 local CPU ranks, then rank every schedule under the measured costs and a memory limit in M_B),
then run every distinct candidate the advice ranked as fitting, on the same 2 ranks, and take
its median step. Reports, per model, whether the pick's measured step is within 5% of the fastest
measured, and the Spearman rank correlation between the predicted makespans and the measured
steps. A shared machine's noise is real here: the candidates are measured in ``--rounds`` rounds,
each running every candidate once (so drift hits them alike), and each candidate's figure is its
median over the rounds; the spread (largest over smallest round) is printed with it.

    PYTHONPATH=src python benchmarks/advise_accuracy.py [--models mlp,gpt] [--steps 6] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics

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
    parser.add_argument("--models", default="mlp,gpt")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for model in args.models.split(","):
        prof = profile(model, RANKS, MICROBATCHES, BATCH)
        advice = advise_from_profile(prof, LIMIT)
        seen, ranked = set(), []
        for c in advice.fitting:
            key = (c.schedule, c.chunks, c.microbatches, c.recompute)
            if key not in seen:
                seen.add(key)
                ranked.append(c)
        rounds = [[measured_step(model, c, args.steps) for c in ranked] for _ in range(args.rounds)]
        per = list(zip(*rounds))
        steps = [statistics.median(times) for times in per]
        print(f"\n{model}: {len(ranked)} candidates that fit (p={RANKS}, m={MICROBATCHES}, limit {LIMIT:g} M_B), "
              f"{args.rounds} rounds of {args.steps} steps")
        print("| # | candidate | predicted ms | measured ms (median) | spread |")
        print("|---|---|---|---|---|")
        for i, (c, t, times) in enumerate(zip(ranked, steps, per)):
            print(f"| {i + 1} | {c.label()} | {c.makespan:.2f} | {1e3 * t:.2f} | {max(times) / min(times):.2f}x |")
        fastest = min(steps)
        pick = steps[0]
        print(f"pick {ranked[0].label()}: {1e3 * pick:.2f} ms; fastest measured "
              f"{ranked[steps.index(fastest)].label()}: {1e3 * fastest:.2f} ms; pick / fastest = {pick / fastest:.3f} "
              f"({'within' if pick <= (1 + NEAR) * fastest else 'NOT within'} 5%); "
              f"Spearman(predicted, measured) = {spearman([c.makespan for c in ranked], steps):.2f}")


if __name__ == "__main__":
    main()
