"""Runtime benchmark: pipesched's engine against torch.distributed.pipelining, side by side.

Two ranks (gloo, one thread each), the same blocks, data, partition (balanced per placement from
the models' block cost estimates) and SGD for both; each pair of schedules (ours / torch's
counterpart) is measured in the same processes, the variants taking turns of a few steps, so
that the shared machine's drift hits all of them alike, and ratios are paired turn by turn.
Reports medians and ratios, and for our schedules the measured step against the simulator fed
with the measured per-action costs and p2p latency (``measured/sim``: median cost per stage and
kind; ``measured/replay``: every step replayed with its own actions' durations), the zero-bubble
gain against the simulator's predicted gain, and split backward (I + W) against one full
backward on a transformer block.

    PYTHONPATH=src python benchmarks/runtime.py [--rounds 12] [--burst 3] [--models mlp,gpt] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from time import perf_counter

import split_block  # benchmarks/split_block.py, next to this script
import torch
import torch.distributed as dist
from torch import nn

import pipesched
from pipesched.runtime.comm.latency import measure_latency
from pipesched.runtime.executor import PipelineRuntime, RuntimeOptions
from pipesched.runtime.stages.staged_model import StagedModel
from pipesched.runtime.launching.launch import (
    rank_device,
    run_torchrun,
    spawn,
    under_torchrun,
)
from pipesched.runtime.metering.timeline import (
    compare_to_simulation,
    median_costs,
    replayed_makespan,
)
from pipesched.runtime.stages.copies import balanced_block_counts
from pipesched.runtime.stages.partition import build_block_seeded, stage_block_ranges
from pipesched.training.models import get_model

PAIRS = [  # ours, torch's class
    ("1f1b", "Schedule1F1B"),
    ("interleaved-1f1b", "ScheduleInterleaved1F1B"),
    ("zb-v", "ScheduleZBVZeroBubble"),
    ("interleaved-zb", "ScheduleInterleavedZeroBubble"),
]
MODELS = {
    "mlp": dict(blocks=8, dim=256, hidden=1024),  # 9 blocks: 8 residual MLPs + head
    "gpt": dict(layers=8, dim=128, heads=4, context=32),  # 10 blocks: embedding, 8 layers, head
}
BATCH, MICROBATCHES, SEED, LR = 64, 8, 0, 0.05


def _torch_runner(md, name: str, schedule: pipesched.Schedule, rank: int):
    """torch's schedule on the same stages as ours; returns a step function timing one step."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as ts

    ranges = stage_block_ranges(md.num_blocks, schedule.stages, balanced_block_counts(md.block_costs, schedule))
    owned = [s for s, r in enumerate(schedule.placement) if r == rank]
    device = rank_device()
    mods = {s: nn.Sequential(*(build_block_seeded(md.build_block, i, SEED) for i in ranges[s])).to(device) for s in owned}
    stages = [PipelineStage(mods[s], s, schedule.stages, device) for s in owned]
    cls = getattr(ts, name)
    single = issubclass(cls, ts.PipelineScheduleSingle)
    sched = cls(stages[0] if single else stages, n_microbatches=MICROBATCHES, loss_fn=md.loss_fn)
    opt = torch.optim.SGD([p for m in mods.values() for p in m.parameters()], lr=LR)
    first, last = 0 in owned, schedule.stages - 1 in owned

    def step(x, y) -> float:
        x, y = x.to(device), y.to(device)
        dist.barrier()
        t0 = perf_counter()
        args = (x,) if first else ()
        kwargs = dict(target=y, losses=[]) if last else {}
        sched.step(*args, return_outputs=False, **kwargs)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return perf_counter() - t0

    return step


def _ours_runner(md, schedule: pipesched.Schedule, timelines: list):
    x0, _ = md.batch(0, BATCH, SEED)
    rt = PipelineRuntime(
        StagedModel(md.build_block, md.num_blocks, x0[: BATCH // MICROBATCHES],
                    block_counts=balanced_block_counts(md.block_costs, schedule)),
        schedule, md.loss_fn, lambda ps: torch.optim.SGD(ps, lr=LR),
        options=RuntimeOptions(seed=SEED, device=rank_device()),
    )

    def step(x, y) -> float:
        result = rt.step(x, y)
        timelines.append(result.spans)
        return result.step_time

    return step


def bench_worker(rank: int, world: int, job: tuple) -> dict:
    model, rounds, steps, pairs, burst, with_torch = job
    md = get_model(model, **MODELS[model])
    runners, times, spans = {}, {}, {}
    for ours, theirs in pairs:
        schedule = pipesched.build_schedule(ours, world, MICROBATCHES)
        spans[ours] = []
        runners[ours] = _ours_runner(md, schedule, spans[ours])
        if with_torch:
            runners["torch:" + theirs] = _torch_runner(md, theirs, schedule, rank)
    batches = [md.batch(i, BATCH, SEED) for i in range(steps)]
    for label, run in runners.items():  # warm-up: torch infers shapes on its first step
        run(*batches[0])
        times[label] = []
    for label in spans:
        spans[label].clear()
    # each variant in turn, ``burst`` steps at a time, so that the shared machine's noise spreads
    # evenly over them; the first step of a burst of several is a warm-up (its caches hold the
    # previous variant's weights) and is not recorded
    for i in range(rounds):
        for label, run in runners.items():
            for j in range(burst + (burst > 1)):
                x, y = batches[(i * burst + j) % len(batches)]
                t = run(x, y)
                if burst == 1 or j > 0:
                    times[label].append(t)
                elif label in spans:
                    spans[label].pop()
    with torch.no_grad():  # the latency probe carries one activation (the first block's output)
        act = build_block_seeded(md.build_block, 0, SEED)(md.batch(0, BATCH // MICROBATCHES, SEED)[0])
    latency = measure_latency(act.shape, act.dtype, rank_device())
    # step time of a step = slowest rank's
    gathered = [None] * world if rank == 0 else None
    dist.gather_object((times, spans), gathered, dst=0)
    if rank != 0:
        return {}
    step_times = {k: [max(g[0][k][i] for g in gathered) for i in range(len(times[k]))] for k in times}
    timelines = {k: [[g[1][k][i] for g in gathered] for i in range(len(spans[k]))] for k in spans}
    from pipesched.runtime.launching import launch

    return {"step_times": step_times, "timelines": timelines, "latency": latency, "memory_kept": launch.memory_kept}


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return q1, q2, q3


def summarise(model: str, res: dict, pairs: list, burst: int) -> list[dict]:
    """Per pair: medians, and ratios paired round by round (each round's figure is the median of
    its burst), so that the machine's drift between rounds cancels out of the ratios."""
    times = res["step_times"]

    def per_round(label: str) -> list[float]:
        t = times[label]
        return [statistics.median(t[i : i + burst]) for i in range(0, len(t), burst)]

    rows, sims = [], {}
    for ours, theirs in pairs:
        schedule = pipesched.build_schedule(ours, 2, MICROBATCHES)
        mine = statistics.median(times[ours])
        theirs_label = "torch:" + theirs
        paired = [a / b for a, b in zip(per_round(ours), per_round(theirs_label))] if theirs_label in times else None
        c = compare_to_simulation(schedule, res["timelines"][ours], res["latency"])
        replays = [replayed_makespan(schedule, tl, res["latency"]) for tl in res["timelines"][ours]]
        programs = [max(span.end for rank in tl for span in rank) for tl in res["timelines"][ours]]
        replay = statistics.median(t / r for t, r in zip(times[ours], replays))
        sims[ours] = c.simulated_makespan
        rows.append({
            "model": model, "schedule": ours, "torch": theirs, "ours_ms": 1000 * mine,
            "torch_ms": 1000 * statistics.median(times[theirs_label]) if paired else None,
            "ratio_q": _quartiles(paired) if paired else None, "sim_ms": 1000 * c.simulated_makespan,
            "measured_over_sim": mine / c.simulated_makespan, "measured_over_replay": replay,
            # the program alone (the step's start to its last action's end) against its replay: what
            # the engine loses between actions; the rest of the step is its tail (loss agreement,
            # optimizer, weight guard), which a replay of the actions does not hold
            "program_over_replay": statistics.median(p / r for p, r in zip(programs, replays)),
            "tail_ms": 1000 * statistics.median(t - p for t, p in zip(times[ours], programs)),
            "bubble": c.measured_bubble, "sim_bubble": c.simulated_bubble,
            "kind_costs_ms": {k: 1000 * v for k, v in c.kind_costs.items()},
            "stage_kind_costs_ms": {f"{s}{k}": 1000 * v for (s, k), v in sorted(median_costs(res["timelines"][ours]).items())},
        })
    if "1f1b" in sims:
        for row in rows:
            if row["schedule"] in ("zb-v", "interleaved-zb"):
                gains = [1 - a / b for a, b in zip(per_round(row["schedule"]), per_round("1f1b"))]
                row["gain_q"] = _quartiles(gains)
                row["predicted_gain"] = 1 - sims[row["schedule"]] / sims["1f1b"]
    return rows


def _fmt(value, fmt: str) -> str:
    return "-" if value is None else f"{value:{fmt}}"


def _spread(q: tuple[float, float, float], scale: float = 1.0, fmt: str = ".2f") -> str:
    return f"{scale * q[1]:{fmt}} ({scale * q[0]:{fmt}}-{scale * q[2]:{fmt}})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12, help="turns of each variant")
    parser.add_argument("--steps", type=int, default=4, help="distinct batches cycled through")
    parser.add_argument("--burst", type=int, default=3, help="consecutive steps of a variant per turn (after one warm-up step)")
    parser.add_argument("--models", default="mlp,gpt")
    parser.add_argument("--schedules", default=",".join(o for o, _ in PAIRS), help="ours, among " + ", ".join(o for o, _ in PAIRS))
    parser.add_argument("--without-torch", action="store_true",
                        help="only our schedules (many turns are cheap then: for the zero-bubble gain)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        pairs = [pair for pair in PAIRS if pair[0] in args.schedules.split(",")]
        job = (model, args.rounds, args.steps, pairs, args.burst, not args.without_torch)
        res = run_torchrun(bench_worker, job, 300) if under_torchrun() else spawn(bench_worker, 2, job, timeout_s=300)[0]
        if not res:  # a torchrun rank other than 0
            continue
        rows += summarise(model, res, pairs, args.burst)
        print(
            f"p2p latency ({model} activation, one way): {1000 * res['latency']:.3f} ms; "
            f"freed memory kept in the ranks (both engines): {res.get('memory_kept', False)}", flush=True,
        )
    print("ours/torch and gain vs 1f1b: median over rounds of the round's paired figure (quartiles)")
    print("measured/replay: the whole step against the replay of its actions; program/replay: the step's start to")
    print("its last action's end (what the engine loses between actions); tail: the step after its last action")
    print("| model | schedule | ours ms | torch ms | ours/torch | target | simulated ms | measured/sim | measured/replay | program/replay | tail ms | gain vs 1f1b | predicted gain |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        target = 0.85 if r["schedule"] in ("1f1b", "interleaved-1f1b") else 0.6
        gain = _spread(r["gain_q"], 100, ".1f") + "%" if "gain_q" in r else ""
        pred = f"{100 * r['predicted_gain']:.1f}%" if "predicted_gain" in r else ""
        print(
            f"| {r['model']} | {r['schedule']} vs {r['torch']} | {r['ours_ms']:.1f} | "
            f"{_fmt(r['torch_ms'], '.1f')} | {_spread(r['ratio_q']) if r['ratio_q'] else '-'} | <= {target} | "
            f"{r['sim_ms']:.1f} | {r['measured_over_sim']:.2f} | "
            f"{r['measured_over_replay']:.2f} | {r['program_over_replay']:.2f} | {r['tail_ms']:.1f} | {gain} | {pred} |"
        )
    if not rows:
        return 0
    size = MODELS["gpt"]  # one block of the benchmark's GPT, one microbatch, one thread
    split = split_block.measure("cpu", size["dim"], size["heads"], size["context"], BATCH // MICROBATCHES)
    print(
        f"split backward on a transformer block: full B {split['B_ms']:.3f} ms, "
        f"I {split['I_ms']:.3f} + W {split['W_ms']:.3f} ms -> (I+W)/B = {split['ratio']:.3f} (target <= 1.10)"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "split_backward": split}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
