"""zb-auto in ``pipesched train``: planned with the measured costs against unit costs, side by side.

For each model (the runtime's mlp and gpt at train's default sizes, batch 64, m = 8) and rank
count: one profile, the one ``pipesched train -s zb-auto`` runs (ZB-H1, ``PROFILE_STEPS`` steps),
then two zb-auto plans: from the profile's costs (what train plans now: the search led by them,
or the unit-cost plan where they rank that first) and from unit costs (what it planned before,
and what ``--costs 1,1,1`` plans), both at the same ``--memory-limit`` and measured recompute share. Each plan is simulated under the
measured costs, then both are trained in the same processes, taking turns of a few steps (the
first of each turn a warm-up), the step being the slowest rank's; the ratio measured/unit is
paired turn by turn (median and quartiles over turns), so that this shared machine's drift
cancels out of it. With ``--startup``, the whole command's wall time with the profile and with
``--costs 1,1,1`` (what the profile adds to a run's start), in alternating pairs.

    PYTHONPATH=src python benchmarks/zb_auto_costs.py [--models mlp,gpt] [--ranks 2,4] [--rounds 10] [--burst 3] [--memory-limit 1] [--startup 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from dataclasses import replace
from time import perf_counter
from typing import Optional

import torch
import torch.distributed as dist
from pipesched.zb_auto_plan import (
    chunks_for_model,
    zb_auto_inputs,
    zb_auto_profile,
)

import pipesched
from pipesched.costs import UNIT
from pipesched.memory import schedule_recompute
from pipesched.runtime.executor import PipelineRuntime, RuntimeOptions
from pipesched.runtime.stages.staged_model import StagedModel
from pipesched.runtime.launching.launch import spawn
from pipesched.runtime.stages.copies import balanced_block_counts
from pipesched.training.models import get_model

BATCH, MICROBATCHES, SEED, LR = 64, 8, 0, 0.05  # train's defaults


def bench_worker(rank: int, world: int, job: tuple) -> dict:
    """Both plans on the same ranks, in turns; rank 0 returns each step's slowest-rank time."""
    model, plans, rounds, burst = job
    md = get_model(model)
    x0, _ = md.batch(0, BATCH, SEED)
    runtimes = {
        label: PipelineRuntime(
            StagedModel(md.build_block, md.num_blocks, x0[: BATCH // MICROBATCHES],
                        block_counts=balanced_block_counts(md.block_costs, plan)),
            plan, md.loss_fn, lambda ps: torch.optim.SGD(ps, lr=LR),
            options=RuntimeOptions(seed=SEED,
                                   recompute=None if schedule_recompute(plan) is None else schedule_recompute(plan).spec()),
        )
        for label, plan in plans.items()
    }
    batches = [md.batch(i, BATCH, SEED) for i in range(4)]
    times: dict[str, list[float]] = {label: [] for label in plans}
    for i in range(rounds):
        order = list(runtimes.items()) if i % 2 == 0 else list(runtimes.items())[::-1]
        for label, rt in order:
            for j in range(burst + 1):  # the first of a turn is a warm-up (caches hold the other plan's)
                t = rt.step(*batches[(i + j) % len(batches)]).step_time
                if j:
                    times[label].append(t)
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(times, gathered, dst=0)
    if rank != 0:
        return {}
    return {label: [max(g[label][k] for g in gathered) for k in range(len(times[label]))] for label in plans}


def quartiles(values: list[float]) -> tuple[float, float, float]:
    return tuple(statistics.quantiles(values, n=4)) if len(values) > 1 else (values[0],) * 3


def compare(model: str, ranks: int, rounds: int, burst: int, limit: Optional[float]) -> str:
    prof = zb_auto_profile(model, ranks, MICROBATCHES, BATCH, SEED, "fp32")
    inputs = zb_auto_inputs(prof, None, limit, None, None)  # as train plans (and says on stderr)
    measured_costs = inputs.costs
    chunks = chunks_for_model(None, ranks, get_model(model).num_blocks)
    plans = {  # the unit-cost plan: what train planned before, with the same limit and measured share
        "measured": inputs.plan(ranks, MICROBATCHES, chunks),
        "unit": replace(inputs, costs=UNIT, measured=False).plan(ranks, MICROBATCHES, chunks),
    }
    sim = {label: pipesched.simulate(plan, measured_costs).makespan for label, plan in plans.items()}
    same = plans["measured"].orders == plans["unit"].orders and plans["measured"].placement == plans["unit"].placement
    times = spawn(bench_worker, ranks, (model, plans, rounds, burst), timeout_s=600)[0]
    per_turn = {label: [statistics.median(t[i:i + burst]) for i in range(0, len(t), burst)] for label, t in times.items()}
    ratio = quartiles([a / b for a, b in zip(per_turn["measured"], per_turn["unit"])])
    c = measured_costs
    print(f"  {model} p={ranks}: costs F {c.F:.2f} I {c.B:.2f} W {c.W:.2f} comm {c.comm:.2f} ms, stage factors "
          f"{', '.join(f'{x:.2f}' for x in c.stage_multipliers)}; measured plan {plans['measured'].meta['origin']} "
          f"(chunks {plans['measured'].chunks}), unit plan {plans['unit'].meta['origin']} (chunks {plans['unit'].chunks})",
          file=sys.stderr, flush=True)
    return (f"| {model} | {ranks} | {'-' if limit is None else f'{limit:g}'} | {'same' if same else 'differ'} | {sim['measured']:.1f} | {sim['unit']:.1f} | "
            f"{sim['measured'] / sim['unit']:.3f} | {1e3 * statistics.median(times['measured']):.1f} | "
            f"{1e3 * statistics.median(times['unit']):.1f} | {ratio[1]:.3f} ({ratio[0]:.2f}-{ratio[2]:.2f}) |")


def startup(pairs: int) -> str:
    """Wall time of ``pipesched train -s zb-auto`` (mlp, 2 ranks, 2 steps) with its profile and with
    ``--costs 1,1,1``, in alternating pairs."""
    base = [sys.executable, "-m", "pipesched", "train", "--model", "mlp", "-s", "zb-auto", "--ranks", "2", "--steps", "2"]
    walls: dict[str, list[float]] = {"profiled": [], "unit": []}
    for i in range(pairs):
        variants = [("profiled", base), ("unit", base + ["--costs", "1,1,1"])]
        for label, argv in variants if i % 2 == 0 else variants[::-1]:
            t0 = perf_counter()
            subprocess.run(argv, check=True, capture_output=True)
            walls[label].append(perf_counter() - t0)
    ratios = [a / b for a, b in zip(walls["profiled"], walls["unit"])]
    return (f"whole command (mlp, 2 ranks, 2 steps), median of {pairs} pairs: with the profile "
            f"{statistics.median(walls['profiled']):.1f} s, --costs 1,1,1 {statistics.median(walls['unit']):.1f} s, "
            f"ratio {statistics.median(ratios):.2f} (per pair: {', '.join(f'{r:.2f}' for r in ratios)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,gpt")
    parser.add_argument("--ranks", default="2")
    parser.add_argument("--rounds", type=int, default=10, help="turns of each plan")
    parser.add_argument("--burst", type=int, default=3, help="measured steps per turn (after one warm-up step)")
    parser.add_argument("--memory-limit", type=float, default=None, help="zb-auto's limit in M_B (default: none, p)")
    parser.add_argument("--startup", type=int, default=0, help="pairs of whole-command runs (0: none)")
    args = parser.parse_args()
    print("| model | ranks | limit (M_B) | plans | simulated ms, measured-cost plan | simulated ms, unit-cost plan | ratio | "
          "measured ms, measured-cost plan | measured ms, unit-cost plan | measured/unit, paired (quartiles) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for ranks in (int(r) for r in args.ranks.split(",")):
        for model in args.models.split(","):
            print(compare(model, ranks, args.rounds, args.burst, args.memory_limit), flush=True)
    if args.startup:
        print(startup(args.startup))


if __name__ == "__main__":
    main()
