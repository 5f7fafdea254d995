"""Data x pipeline parallelism figures: equivalence, bf16, overlapped gradient reduction.

Run: PYTHONPATH=src python benchmarks/data_parallel.py [equivalence] [overlap]   (Markdown for RESULTS.md)

- equivalence: every registered schedule at P=2, D=2 (4 gloo processes), mlp and gpt: loss,
  first-step gradients and parameters after 3 steps against one process on the global batch
  (fp32, max relative error), and the bf16 run's loss after 3 steps against the fp32 run's.
- overlap: P=2, D=2, each stage's all-reduce started after its last W/B against every all-reduce
  after the step's last action, turn by turn on the same processes (paired ratios, medians); and
  the step the simulator predicts from the measured action costs, p2p latency and all-reduce time.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from time import perf_counter

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import pipesched  # noqa: E402
from pipesched.runtime.launch import spawn  # noqa: E402
from runtime_cases import STEPS, reference, relative_error, run_data_parallel  # noqa: E402

SIZES = {"mlp": dict(blocks=5, dim=16, hidden=32), "gpt": dict(layers=2, dim=16, heads=2, context=8)}
BATCH = 16
MICROBATCHES = 4


def equivalence() -> list[str]:
    lines = [
        f"Every schedule at P=2, D=2 (4 gloo processes), m={MICROBATCHES} per replica, global batch {BATCH}, "
        f"{STEPS} SGD steps; errors are max |a-b| / max |b| per tensor against one process on the global batch; "
        "bf16 = the bf16 run's loss after the last step over the fp32 run's.",
        "",
        "| model | schedule | loss error | grads error | params error | bf16 losses finite | bf16 / fp32 loss after 3 steps |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, size in SIZES.items():
        runs = []
        for family in pipesched.families():
            schedule = pipesched.build_schedule(family.name, 2, MICROBATCHES)
            runs += [(family.name, schedule, torch.float32, None), (family.name + " bf16", schedule, torch.bfloat16, None)]
        results = spawn(run_data_parallel, 4, (model, size, BATCH, runs, 2), timeout_s=300)[0]
        for extra in ("places", "nonfinite"):
            results.pop(extra, None)
        ref = reference(model, size, BATCH)
        for family in pipesched.families():
            got, bf16 = results[family.name], results[family.name + " bf16"]
            finite = all(torch.isfinite(torch.tensor(bf16["losses"])))
            lines.append(
                f"| {model} | {family.name} | {abs(got['losses'][0] - ref['loss']) / abs(ref['loss']):.1e} | "
                f"{relative_error(got['grads'], ref['grads']):.1e} | {relative_error(got['params'], ref['params']):.1e} | "
                f"{'yes' if finite else 'NO'} | {bf16['losses'][-1] / got['losses'][-1]:.4f} |"
            )
    return lines


OVERLAP_MODEL = dict(blocks=5, dim=384, hidden=1536)
OVERLAP_BATCH = 64
ROUNDS = 20


def overlap_worker(rank: int, world: int, job: tuple) -> dict:
    """Two runtimes on the same 2D mesh and weights, one overlapping the all-reduce, one not,
    stepped turn by turn; step times, replica 0's timelines, and the all-reduce time per stage."""
    import torch.distributed as dist

    from pipesched.runtime.executor import PipelineRuntime
    from pipesched.runtime.mesh import init_pipeline_mesh
    from pipesched.runtime.models import get_model
    from pipesched.runtime.train import make_optimizer, measure_latency

    name, rounds = job
    md = get_model("mlp", **OVERLAP_MODEL)
    schedule = pipesched.build_schedule(name, 2, MICROBATCHES)
    mesh = init_pipeline_mesh(2, 2)
    x0, _ = md.batch(0, OVERLAP_BATCH, 0)
    sample = x0[: OVERLAP_BATCH // (2 * MICROBATCHES)]
    runtimes = {
        overlap: PipelineRuntime(md.build_block, md.num_blocks, schedule, md.loss_fn, make_optimizer("sgd", 0.01),
                                 sample, mesh=mesh, overlap_grad_sync=overlap, timeout_s=300)
        for overlap in (True, False)
    }
    latency = measure_latency(*next(iter(runtimes[True].transport.buffer_spec.values())), torch.device("cpu"))
    times = {True: [], False: []}
    spans = []
    for step in range(rounds):
        x, y = md.batch(step, OVERLAP_BATCH, 0)
        for overlap in ((True, False) if step % 2 else (False, True)):
            result = runtimes[overlap].step(x, y)
            times[overlap].append(result.step_time)
            if overlap:
                spans.append(result.spans)
    # the all-reduce of each of this rank's stages alone, as the runtime buckets it
    rt = runtimes[True]
    reduce_ms = {}
    for stage, module in rt.stages.items():
        flat = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
        trips = []
        for _ in range(7):
            dist.barrier(group=mesh.dp_group)
            t0 = perf_counter()
            dist.all_reduce(flat, group=mesh.dp_group)
            trips.append(perf_counter() - t0)
        reduce_ms[stage] = statistics.median(trips)
    parts = [None] * world
    dist.all_gather_object(parts, (times, spans, reduce_ms))
    if rank != 0:
        return {}
    grid = mesh.grid[0]
    return {
        "times": {k: [max(parts[r][0][k][i] for r in range(world)) for i in range(rounds)] for k in (True, False)},
        "timelines": [[parts[r][1][i] for r in grid] for i in range(rounds)],
        "reduce": {s: t for r in grid for s, t in parts[r][2].items()},
        "latency": latency,
    }


def overlap() -> list[str]:
    from pipesched.advise.layout import AllReduceCost, gradient_sync
    from pipesched.execution import execute
    from pipesched.runtime.timeline import makespan as timeline_makespan
    from pipesched.runtime.timeline import median_costs

    lines = [
        f"mlp {OVERLAP_MODEL}, P=2, D=2 (4 gloo processes, one thread each), global batch {OVERLAP_BATCH}, "
        f"m={MICROBATCHES} per replica; {ROUNDS} steps each, turn by turn (the first of each dropped); "
        f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs.",
        "",
        "| schedule | overlapped / reduce-after (median of paired ratios) | median step overlapped | median step reduce-after | "
        "actions end (measured / replayed) | simulated step | measured / simulated | measured / (measured actions + modelled all-reduce) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("zb-v", "interleaved-1f1b", "1f1b"):
        out = spawn(overlap_worker, 4, (name, ROUNDS), timeout_s=600)[0]
        on, off = out["times"][True][1:], out["times"][False][1:]
        ratio = statistics.median(a / b for a, b in zip(on, off))
        schedule = pipesched.build_schedule(name, 2, MICROBATCHES)
        steps = out["timelines"][1:]
        costs = median_costs(steps)
        orders = [schedule.rank_actions(r) for r in range(schedule.ranks)]
        replay = execute(orders, schedule.placement, lambda a: costs[(a.stage, a.kind)], out["latency"])
        # the measured all-reduce of each stage, as a cost of that stage (bandwidth 1 byte per second)
        seconds = [out["reduce"][s] for s in range(schedule.stages)]
        # 2 (D-1)/D = 1 at D=2: with bandwidth 1 each stage's term is its measured time
        cost = AllReduceCost(2, bandwidth=1.0, latency=0.0, bucket_bytes=float("inf"))
        predicted = gradient_sync(replay, seconds, cost)
        # the all-reduce model alone: each measured step's own timeline plus the modelled reductions
        on_measured = statistics.median(a / gradient_sync(t, seconds, cost).step_time for a, t in zip(on, steps))
        measured = statistics.median(on)
        lines.append(
            f"| {name} | {ratio:.3f} | {1e3 * measured:.1f} ms | {1e3 * statistics.median(off):.1f} ms | "
            f"{1e3 * statistics.median(timeline_makespan(t) for t in steps):.1f} / {1e3 * timeline_makespan(replay):.1f} ms | "
            f"{1e3 * predicted.step_time:.1f} ms | {measured / predicted.step_time:.3f} | {on_measured:.3f} |"
        )
    return lines


def main() -> None:
    wanted = set(sys.argv[1:]) or {"equivalence", "overlap"}
    if "equivalence" in wanted:
        print("\n".join(equivalence()))
        print()
    if "overlap" in wanted:
        print("\n".join(overlap()))


if __name__ == "__main__":
    main()
