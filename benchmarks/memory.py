"""Memory benchmark: activation bytes the runtime measures against what the memory model predicts.

For every schedule (dualpipe too: two model copies) on 2 and 4 ranks (gloo, CPU, small widths), mlp and gpt, m = 8 and 12: each
rank's most activation bytes held in any step (saved tensors by storage, W stashes, stage inputs,
recomputed activations) against :mod:`pipesched.memory` fed with the per-stage sizes measured
on the first step, stored and recomputed (every stage, block by block); the measured ordering of
the schedules at 4 ranks, m = 12, as ratios to 1F1B; recomputation on every stage on 2 and 4
ranks (peak and step time against the same schedule without it, with the meter and without);
and the meter's own cost (step time with the meter against the same runtime with its hooks
removed).
Step times: the variants take turns of a few steps in the same processes, medians of paired
ratios; besides the wall-clock step, the CPU time every rank's process spent on it, summed (on
a shared machine the wall clock also counts waiting for a core).

    PYTHONPATH=src python benchmarks/memory.py [--quick] [--json out.json]

Under torchrun (``--device-check``, what ``benchmarks/gpu_check.sh`` runs with ranks sharing a
GPU over gloo) it runs the GPT at the width given on the ranks torchrun started and prints, per
schedule and rank, the activation bytes measured and predicted and, on CUDA, the memory a step
adds on the device (``max_memory_allocated`` less the step-start allocation: weights, gradients,
optimizer state) against the prediction.

    torchrun --nproc-per-node 4 benchmarks/memory.py --device-check --dim 1024 --layers 8 --context 1024
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import types

import torch
import torch.distributed as dist

import pipesched
from pipesched.runtime.executor import PipelineRuntime, RuntimeOptions
from pipesched.runtime.stages.staged_model import StagedModel
from pipesched.runtime.launching.launch import (
    rank_device,
    run_torchrun,
    spawn,
    under_torchrun,
)
from pipesched.runtime.stages.copies import balanced_block_counts
from pipesched.training.models import get_model
from pipesched.training.train import make_optimizer

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "v-half", "v-min", "dualpipe")
ORDER = ("v-min", "v-half", "zb-v", "1f1b", "zb-h1", "zb-h2", "gpipe")
RECOMPUTED = ("gpipe", "1f1b", "zb-h1", "zb-v", "v-half", "dualpipe")  # also measured with every stage recomputed
MODELS = {
    "mlp": dict(blocks=8, dim=64, hidden=256),  # 9 blocks
    "gpt": dict(layers=6, dim=64, heads=4, context=32),  # 8 blocks
}
MICROBATCH = 4  # samples per microbatch
STEPS = 2
TIMED = dict(blocks=8, dim=256, hidden=1024)  # pipesched train's mlp: step times at a size where compute dominates
TIMED_MICROBATCH = 8


def _runtime(md, schedule, recompute=None, microbatch=MICROBATCH) -> PipelineRuntime:
    x0, _ = md.batch(0, microbatch * schedule.microbatches, 0)
    return PipelineRuntime(
        StagedModel(md.build_block, md.num_blocks, x0[:microbatch],
                    block_counts=balanced_block_counts(md.block_costs, schedule)),
        schedule, md.loss_fn, make_optimizer("sgd", 0.05),
        options=RuntimeOptions(recompute=recompute, timeout_s=600, device=rank_device(),
                               meter_every_step=True),  # the meter counts every step measured here
    )


def _without_meter(rt: PipelineRuntime) -> None:
    """Remove the meter's hooks: the same runtime, counting nothing (for the overhead ratio)."""
    rt.meter.saved_tensors = contextlib.nullcontext
    rt.meter.hold = lambda tensor: types.SimpleNamespace(nbytes=0)
    rt.meter.recomputation = contextlib.nullcontext
    rt.meter.count_until_freed = lambda tensor: None
    rt.stash.hold = None


def _runs(names) -> list[tuple[str, str, object]]:
    """(label, schedule, recompute): every schedule stored, and those of RECOMPUTED recomputed."""
    return [(n, n, None) for n in names] + [(f"{n} recompute", n, "all") for n in names if n in RECOMPUTED]


def measure(rank: int, world: int, job: tuple) -> dict:
    """Per (label, schedule, recompute): every rank's (measured, predicted) peak activation
    bytes, and on CUDA the most a step added to the device's allocation."""
    torch.set_num_threads(1)
    model, m, runs, *size = job
    size, microbatch = (size[0], size[1]) if size else (MODELS[model], MICROBATCH)
    md = get_model(model, **size)
    out = {}
    for label, name, recompute in runs:
        schedule = pipesched.build_schedule(name, world, m)
        rt = _runtime(md, schedule, recompute, microbatch=microbatch)
        results = [rt.step(*md.batch(step, microbatch * m, 0)) for step in range(STEPS)]
        measured = max(r.peak_activation_bytes for r in results)
        added = [r.device_peak_bytes - r.device_baseline_bytes for r in results if r.device_peak_bytes is not None]
        parts = [None] * world
        dist.all_gather_object(parts, (measured, rt.predicted_peak_activation_bytes(), max(added) if added else None))
        out[label] = parts
        del rt, results
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return out


def device_check(args) -> int:
    """This process's rank under torchrun: GPT at the given width, every schedule asked for."""
    size = dict(layers=args.layers, dim=args.dim, heads=args.dim // 64, context=args.context)
    names = args.schedules.split(",")
    runs = [(n, n, None) for n in names]
    results = run_torchrun(measure, ("gpt", args.microbatches, runs, size, args.microbatch), 1800)
    if int(__import__("os").environ["RANK"]) != 0:
        return 0
    world = len(next(iter(results.values())))
    print(f"GPT layers={args.layers} width={args.dim} context={args.context} b={args.microbatch} "
          f"m={args.microbatches}, {world} ranks; MB per rank: measured / predicted activations, device added")
    worst = 0.0
    for name, ranks in results.items():
        cells = []
        for meas, pred, added in ranks:
            worst = max(worst, abs(meas / pred - 1))
            cells.append(f"{meas / 1e6:.0f}/{pred / 1e6:.0f}" + (f" dev {added / 1e6:.0f} ({added / pred:.2f}x)" if added else ""))
        print(f"  {name:10} " + "   ".join(cells))
    print(f"memory: {'PASS' if worst <= 0.10 else 'FAIL'} (largest |measured/predicted - 1| {worst:.3f}; "
          "device added / predicted shows what the meter does not count: gradients in flight, workspaces)")
    return 0 if worst <= 0.10 else 1


def timed(rank: int, world: int, job: tuple) -> dict:
    """Variants of one schedule taking turns: (label, recompute, meter on) -> step times and peak."""
    torch.set_num_threads(1)
    model, m, name, variants, rounds, burst, size = job
    md = get_model(model, **size)
    schedule = pipesched.build_schedule(name, world, m)
    runtimes = {}
    batch = TIMED_MICROBATCH * m
    for label, recompute, metered in variants:
        runtimes[label] = rt = _runtime(md, schedule, recompute, TIMED_MICROBATCH)
        if not metered:
            _without_meter(rt)
        rt.step(*md.batch(0, batch, 0))  # warm-up
    times = {label: [] for label in runtimes}
    cpu = {label: [] for label in runtimes}
    peaks = {label: 0 for label in runtimes}
    for turn in range(rounds):
        for label, rt in runtimes.items():
            for step in range(burst):
                t0 = time.process_time()
                result = rt.step(*md.batch(turn * burst + step, batch, 0))
                cpu[label].append(time.process_time() - t0)
                times[label].append(result.step_time)
                peaks[label] = max(peaks[label], result.peak_activation_bytes)
    parts = [None] * world
    dist.all_gather_object(parts, (peaks, cpu))
    return {
        "times": times,
        "peaks": {label: max(p[label] for p, _ in parts) for label in peaks},
        "cpu": {label: [sum(step) for step in zip(*(c[label] for _, c in parts))] for label in cpu},
    }


def _paired_ratio(times: dict, a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 ranks and m=8 only, mlp only")
    parser.add_argument("--timing-only", action="store_true", help="only recompute and meter step times")
    parser.add_argument("--accuracy-schedules", default=",".join(SCHEDULES), help="schedules of the measured/predicted grid")
    parser.add_argument("--recompute-ranks", default="2,4", help="rank counts of the recompute timing (empty: none)")
    parser.add_argument("--recompute-schedules", default=",".join(RECOMPUTED), help="schedules of the recompute timing")
    parser.add_argument("--recompute-width", type=int, default=TIMED["dim"],
                        help="the timed mlp's width (hidden 4x): where kernels dominate Python, recomputation costs less")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--burst", type=int, default=2)
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--device-check", action="store_true", help="under torchrun: the GPT at the width below")
    parser.add_argument("--schedules", default="1f1b,zb-v,v-half,v-min")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--microbatch", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=12)
    args = parser.parse_args(argv)
    if args.device_check:
        if not under_torchrun():
            parser.error("--device-check runs under torchrun")
        return device_check(args)
    configs = [(p, model, m) for p in (2, 4) for model in MODELS for m in (8, 12)]
    if args.quick:
        configs = [(2, "mlp", 8)]
    if args.timing_only:
        configs = []
    report = {"accuracy": {}, "timing": {}}
    worst = 0.0
    print("measured / predicted peak activation bytes, per rank")
    for p, model, m in configs:
        results = spawn(measure, p, (model, m, _runs(args.accuracy_schedules.split(","))), timeout_s=600)[0]
        for name, ranks in results.items():
            ratios = [meas / pred for meas, pred, _ in ranks]
            worst = max(worst, max(abs(r - 1) for r in ratios))
            report["accuracy"][f"{model} p={p} m={m} {name}"] = ranks
            cells = "  ".join(f"{meas / 1024:8.0f}/{pred / 1024:<8.0f}" for meas, pred, _ in ranks)
            print(f"{model:3} p={p} m={m:2} {name:26} KiB {cells}  ratio {min(ratios):.3f}-{max(ratios):.3f}")
        if p == 4 and m == 12 and all(n in results for n in ORDER):
            peak = {n: max(meas for meas, _, _ in results[n]) for n in results}
            line = "  ".join(f"{n} {peak[n] / peak['1f1b']:.2f}" for n in ORDER)
            print(f"{model} p=4 m=12 peak (fullest rank) / 1f1b's: {line}")
            report[f"order {model}"] = {n: peak[n] / peak["1f1b"] for n in ORDER}
    if configs:
        print(f"largest |measured/predicted - 1| over every rank: {worst:.4f}")
    report["worst_relative_error"] = worst
    size = dict(TIMED, dim=args.recompute_width, hidden=4 * args.recompute_width)
    print(f"\nrecompute on every stage, block by block (mlp {size}, b={TIMED_MICROBATCH}, m=8): peak (fullest "
          "rank) and step time against the same schedule without it; with the meter on and off")
    variants = [("plain", None, True), ("recompute", "all", True), ("plain, no meter", None, False),
                ("recompute, no meter", "all", False)]
    for p in (int(r) for r in args.recompute_ranks.split(",") if r):
        for name in args.recompute_schedules.split(","):
            res = spawn(timed, p, ("mlp", 8, name, variants, args.rounds, args.burst, size), timeout_s=1200)[0]
            t, peaks = res["times"], res["peaks"]
            row = {
                "peak_ratio": peaks["recompute"] / peaks["plain"],
                "step_ratio": _paired_ratio(t, "recompute", "plain"),
                "step_ratio_no_meter": _paired_ratio(t, "recompute, no meter", "plain, no meter"),
                "cpu_ratio": _paired_ratio(res["cpu"], "recompute", "plain"),
                "cpu_ratio_no_meter": _paired_ratio(res["cpu"], "recompute, no meter", "plain, no meter"),
                "meter_overhead": _paired_ratio(t, "plain", "plain, no meter"),
                "meter_overhead_recompute": _paired_ratio(t, "recompute", "recompute, no meter"),
            }
            report["timing"][f"p={p} {name} width={args.recompute_width}"] = row
            print(f"p={p} {name:6} recompute peak {row['peak_ratio']:.3f}x, step {row['step_ratio']:.3f}x "
                  f"(meter off: {row['step_ratio_no_meter']:.3f}x), CPU time {row['cpu_ratio']:.3f}x (meter off: "
                  f"{row['cpu_ratio_no_meter']:.3f}x)   meter on / off step: stored "
                  f"{row['meter_overhead']:.3f}x, recomputed {row['meter_overhead_recompute']:.3f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
