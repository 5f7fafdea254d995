"""Data x pipeline parallelism figures: equivalence, bf16, overlapped gradient reduction.

Run: PYTHONPATH=src python benchmarks/data_parallel.py [equivalence] [overlap]   (Markdown for RESULTS.md)

- equivalence: every registered schedule at P=2, D=2 (4 gloo processes), mlp and gpt: loss,
  first-step gradients and parameters after 3 steps against one process on the global batch
  (fp32, max relative error), and the bf16 run's loss after 3 steps against the fp32 run's.
- overlap: P=2, D=2, each stage's all-reduce started after its last W/B against every all-reduce
  after the step's last action, turn by turn on the same processes (paired ratios, medians, three
  launches per schedule); and the step the simulator predicts for each mode from what the same run
  measured: the mean cost of each (stage, kind) of its actions, its p2p latency, each stage's
  all-reduce, and its closing (loss agreement, optimizer step, weight check).
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from time import perf_counter, process_time

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from runtime_cases import STEPS, reference, relative_error, run_data_parallel  # noqa: E402

import pipesched  # noqa: E402
from pipesched.runtime.launching.launch import spawn  # noqa: E402

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
OVERLAP_BATCH = 32  # 4 samples per microbatch: the all-reduce of the weights is a real part of the step
OVERLAP_SCHEDULES = ("1f1b", "interleaved-1f1b", "zb-v", "zb-h1")
LAUNCHES = 3  # separate runs of the 4 processes per schedule
ROUNDS = 20  # steps per mode per launch, turn by turn (the first dropped)


def overlap_worker(rank: int, world: int, job: tuple) -> dict:
    """Two runtimes on the same 2D mesh and weights, one overlapping the all-reduce, one not,
    stepped turn by turn; every rank's step times, action spans and the moment its gradients were
    reduced, and the all-reduce time of each of its stages."""
    import torch.distributed as dist

    from pipesched.runtime.comm.latency import measure_latency
    from pipesched.runtime.comm.mesh import init_pipeline_mesh
    from pipesched.runtime.executor import PipelineRuntime, RuntimeOptions
    from pipesched.runtime.stages.staged_model import StagedModel
    from pipesched.training.models import get_model
    from pipesched.training.train import make_optimizer

    name, rounds = job
    md = get_model("mlp", **OVERLAP_MODEL)
    schedule = pipesched.build_schedule(name, 2, MICROBATCHES)
    mesh = init_pipeline_mesh(2, 2)
    x0, _ = md.batch(0, OVERLAP_BATCH, 0)
    sample = x0[: OVERLAP_BATCH // (2 * MICROBATCHES)]
    runtimes = {
        overlap: PipelineRuntime(StagedModel(md.build_block, md.num_blocks, sample),
                                 schedule, md.loss_fn, make_optimizer("sgd", 0.01), mesh=mesh,
                                 options=RuntimeOptions(overlap_grad_sync=overlap, timeout_s=300))
        for overlap in (True, False)
    }
    reduced_at = {overlap: _time_reductions(rt.reductions) for overlap, rt in runtimes.items()}
    latency = measure_latency(*runtimes[True].probe_tensor(), torch.device("cpu"))
    steps = {True: [], False: []}  # per step: (start, end, reduced, spans, CPU seconds), host clock
    for step in range(rounds):
        x, y = md.batch(step, OVERLAP_BATCH, 0)
        for overlap in ((True, False) if step % 2 else (False, True)):
            cpu = process_time()  # every thread of the process: gloo's included
            result = runtimes[overlap].step(x, y)
            steps[overlap].append((result.origin, result.origin + result.step_time, reduced_at[overlap][-1],
                                   result.spans, process_time() - cpu))
    # the all-reduce of each of this rank's stages alone (all four ranks at once, as at a step's end)
    rt = runtimes[True]
    reduce_s = {}
    for stage, module in rt.stages.items():
        flat = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
        trips = []
        for _ in range(9):
            dist.barrier()
            t0 = perf_counter()
            dist.all_reduce(flat, group=mesh.dp_group)
            trips.append(perf_counter() - t0)
        reduce_s[stage] = statistics.fmean(trips[1:])
    parts = [None] * world
    dist.all_gather_object(parts, (steps, reduce_s))
    if rank != 0:
        return {}
    return {"ranks": [p[0] for p in parts], "reduce": [p[1] for p in parts], "latency": latency, "grid": mesh.grid}


def _time_reductions(sync) -> list[float]:
    """Record when each step's gradients are reduced (``finish`` returns) on the host clock."""
    moments: list[float] = []
    finish = sync.finish

    def timed_finish() -> None:
        finish()
        moments.append(perf_counter())

    sync.finish = timed_finish
    return moments


def _mode(launches: list[dict], overlap: bool) -> dict:
    """One mode's measured steps over every launch (first step of each dropped): the step time
    (first rank's start to last rank's end), the closing (last rank's reduced gradients to the
    step's end), the CPU time of the four processes, and every replica's timeline with times from
    its step's start."""
    times, closings, cpu, timelines = [], [], [], []
    for out in launches:
        ranks = [r[overlap] for r in out["ranks"]]
        for i in range(1, len(ranks[0])):
            start = min(r[i][0] for r in ranks)
            end = max(r[i][1] for r in ranks)
            times.append(end - start)
            closings.append(end - max(r[i][2] for r in ranks))
            cpu.append(sum(r[i][4] for r in ranks))
            for replica in out["grid"]:
                timelines.append([list(ranks[g][i][3]) for g in replica])
    return {"times": times, "closing": statistics.median(closings), "cpu": statistics.median(cpu), "timelines": timelines}


def _predict(schedule, mode: dict, reduce_s: list[float], latency: float, overlap: bool, costs_of) -> tuple[float, float]:
    """The simulator's step: the schedule replayed with ``costs_of`` the measured actions and the
    measured p2p latency, each stage's measured all-reduce on that timeline, then the closing."""
    from pipesched.advise.layout import AllReduceCost, gradient_sync
    from pipesched.execution import execute
    from pipesched.runtime.metering.timeline import makespan

    costs = costs_of(mode["timelines"])
    orders = [schedule.rank_actions(r) for r in range(schedule.ranks)]
    replay = execute(orders, schedule.placement, lambda a: costs[(a.stage, a.kind)], latency)
    # bandwidth 1 byte per second and 2 (D-1)/D = 1 at D=2: each stage's term is its measured time
    cost = AllReduceCost(2, bandwidth=1.0, latency=0.0, bucket_bytes=float("inf"))
    synced = gradient_sync(replay, reduce_s, cost, overlap=overlap, closing=mode["closing"])
    return makespan(replay), synced.step_time


def overlap() -> list[str]:
    from pipesched.runtime.metering.timeline import makespan, mean_costs, median_costs

    lines = [
        f"mlp {OVERLAP_MODEL}, P=2, D=2 (4 gloo processes, one thread each), global batch {OVERLAP_BATCH}, "
        f"m={MICROBATCHES} per replica; {LAUNCHES} launches per schedule, each {ROUNDS} steps per mode turn by turn "
        f"(the first dropped); load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs.",
        "",
        "| schedule | overlapped / reduce-after (median of paired ratios; per launch) | median step overlapped / reduce-after | "
        "CPU per step, 4 processes | all-reduce per rank alone | closing | actions end, overlapped: measured / replayed | "
        "predicted overlapped / reduce-after | measured / predicted, overlapped | measured / predicted, reduce-after | "
        "predicted ratio | measured / predicted from median costs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in OVERLAP_SCHEDULES:
        launches = [spawn(overlap_worker, 4, (name, ROUNDS), timeout_s=600)[0] for _ in range(LAUNCHES)]
        schedule = pipesched.build_schedule(name, 2, MICROBATCHES)
        on, off = _mode(launches, True), _mode(launches, False)
        per_launch = [statistics.median(a / b for a, b in zip(x, y)) for x, y in
                      zip(_split(on["times"], LAUNCHES), _split(off["times"], LAUNCHES))]
        ratio = statistics.median(a / b for a, b in zip(on["times"], off["times"]))
        # each stage's all-reduce: the mean over launches and over the two ranks that reduce it
        by_stage: dict[int, list[float]] = {}
        for out in launches:
            for rank_reduce in out["reduce"]:
                for stage, seconds in rank_reduce.items():
                    by_stage.setdefault(stage, []).append(seconds)
        reduce_s = [statistics.fmean(by_stage[s]) for s in range(schedule.stages)]
        per_rank = max(sum(reduce_s[s] for s in range(schedule.stages) if schedule.placement[s] == r)
                       for r in range(schedule.ranks))
        latency = statistics.median(out["latency"] for out in launches)
        measured_on, measured_off = statistics.median(on["times"]), statistics.median(off["times"])
        replayed, pred_on = _predict(schedule, on, reduce_s, latency, True, mean_costs)
        _, pred_off = _predict(schedule, off, reduce_s, latency, False, mean_costs)
        _, pred_median = _predict(schedule, on, reduce_s, latency, True, median_costs)
        actions_end = statistics.median(makespan(t) for t in on["timelines"])
        lines.append(
            f"| {name} | {ratio:.3f} ({', '.join(f'{r:.3f}' for r in per_launch)}) | "
            f"{1e3 * measured_on:.0f} / {1e3 * measured_off:.0f} ms | {1e3 * on['cpu']:.0f} / {1e3 * off['cpu']:.0f} ms | "
            f"{1e3 * per_rank:.0f} ms | "
            f"{1e3 * on['closing']:.0f} / {1e3 * off['closing']:.0f} ms | {1e3 * actions_end:.0f} / {1e3 * replayed:.0f} ms | "
            f"{1e3 * pred_on:.0f} / {1e3 * pred_off:.0f} ms | "
            f"{measured_on / pred_on:.3f} | {measured_off / pred_off:.3f} | {pred_on / pred_off:.3f} | "
            f"{measured_on / pred_median:.3f} |"
        )
    return lines


def _split(values: list, parts: int) -> list[list]:
    size = len(values) // parts
    return [values[i * size:(i + 1) * size] for i in range(parts)]


def main() -> None:
    wanted = set(sys.argv[1:]) or {"equivalence", "overlap"}
    if "equivalence" in wanted:
        print("\n".join(equivalence()))
        print()
    if "overlap" in wanted:
        print("\n".join(overlap()))


if __name__ == "__main__":
    main()
