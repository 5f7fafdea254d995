"""DualPipe in the runtime: step time against dualpipev and zb-v, and overlapped F&B on CUDA streams.

Default: ``dualpipe`` (two model copies, fed from both ends), ``dualpipev`` and ``zb-v`` on the
same ranks, model and batch (blocks balanced per schedule), stepped turn by turn in the same
processes (a warm-up step, then a burst of steps each turn, in reverse order every other
turn), so that the machine's drift hits all alike; prints each one's median step and the median of the per-turn ratios to zb-v, with
the simulator's ratios at unit costs beside them (what the order alone predicts). dualpipe runs
twice: summing its two copies' gradients stage by stage while the pipeline drains (the default)
and after the last action (``overlap_grad_sync=False``); and what that sum costs alone.

``--streams``: each schedule with overlapped pairs that builds on these ranks (dualpipev on one
rank, dualpipe and dualpipev on two or more) with the pairs' forward halves on a CUDA stream of
their own against the same runtime running the halves one after the other, turn by turn:
losses and parameters of both against the single-process model (PASS within 1e-5 relative) and
the step-time ratio. Only meaningful on CUDA (elsewhere both runs are sequential).

    PYTHONPATH=src python benchmarks/dualpipe.py [--ranks 2] [--rounds 8] [--burst 3]
    torchrun --nproc-per-node 1 benchmarks/dualpipe.py --streams
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from time import perf_counter

import torch

import pipesched
from pipesched.errors import ConfigError
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

SCHEDULES = ("dualpipe", "dualpipev", "zb-v")
SUM_AT_END = "dualpipe, sum after the last action"
MODEL = dict(blocks=8, dim=256, hidden=1024)  # pipesched train's mlp
BATCH, MICROBATCHES, SEED, LR, TOL = 64, 8, 0, 0.05, 1e-5


def _runtime(md, schedule, overlap_streams=False, overlap_grad_sync=True) -> PipelineRuntime:
    x0, _ = md.batch(0, BATCH, SEED)
    return PipelineRuntime(
        StagedModel(md.build_block, md.num_blocks, x0[: BATCH // schedule.microbatches],
                    block_counts=balanced_block_counts(md.block_costs, schedule)),
        schedule, md.loss_fn, make_optimizer("sgd", LR),
        options=RuntimeOptions(seed=SEED, device=rank_device(), timeout_s=300,
                               overlap_streams=overlap_streams, overlap_grad_sync=overlap_grad_sync),
    )


def _turns(runtimes: dict, md, rounds: int, burst: int) -> dict[str, list[float]]:
    """Per variant, its median step of each turn (a warm-up step first, not counted); the
    variants go in reverse order every other turn, so that none always follows the same one."""
    per_turn = {label: [] for label in runtimes}
    order = list(runtimes.items())
    for turn in range(rounds):
        for label, rt in (order if turn % 2 == 0 else order[::-1]):
            times = []
            for i in range(burst + 1):
                result = rt.step(*md.batch(turn * (burst + 1) + i, BATCH, SEED))
                times.append(result.step_time)
            per_turn[label].append(statistics.median(times[1:]))
    return per_turn


def compare_worker(rank: int, world: int, job: tuple) -> dict:
    torch.set_num_threads(1)
    rounds, burst = job
    md = get_model("mlp", **MODEL)
    runtimes = {name: _runtime(md, pipesched.build_schedule(name, world, MICROBATCHES)) for name in SCHEDULES}
    runtimes[SUM_AT_END] = _runtime(md, pipesched.build_schedule("dualpipe", world, MICROBATCHES), overlap_grad_sync=False)
    out = _turns(runtimes, md, rounds, burst)
    sums = []  # what dualpipe's gradient sum of the two copies costs alone (all of it, at once)
    for _ in range(2 * rounds):
        torch.distributed.barrier()
        started = perf_counter()
        runtimes[SUM_AT_END].reductions.finish()
        sums.append(perf_counter() - started)
    out["copy sum"] = [statistics.median(sums)]
    return out


def streams_worker(rank: int, world: int, job: tuple) -> list:
    """Per schedule: (name, streams used, rel. error on and off against the reference, on/off ratio)."""
    rounds, burst = job
    md = get_model("mlp", **MODEL)
    device = rank_device()
    reference = _reference(md, device) if rank == 0 else None
    rows = []
    for name in ("dualpipev", "dualpipe"):
        try:
            schedule = pipesched.build_schedule(name, world, MICROBATCHES)
        except ConfigError:  # dualpipe on one rank
            continue
        errors = {}
        for label, streams in (("streams", True), ("sequential", False)):
            rt = _runtime(md, schedule, streams)
            for step in range(3):
                rt.step(*md.batch(step, BATCH, SEED))
            params = rt.gather_state_dict()
            if rank == 0:
                errors[label] = max(float((params[k] - reference[k]).abs().max() / reference[k].abs().max().clamp_min(1e-30))
                                    for k in reference)
        runtimes = {"streams": _runtime(md, schedule, True), "sequential": _runtime(md, schedule, False)}
        used = runtimes["streams"].streams.side is not None
        per_turn = _turns(runtimes, md, rounds, burst)
        ratio = statistics.median(a / b for a, b in zip(per_turn["streams"], per_turn["sequential"]))
        rows.append((name, used, errors.get("streams"), errors.get("sequential"), ratio))
    return rows


def _reference(md, device) -> dict:
    """The single-process model's parameters after three SGD steps, on ``device``'s results."""
    from pipesched.runtime.stages.partition import build_block_seeded

    model = torch.nn.Sequential(*(build_block_seeded(md.build_block, i, SEED) for i in range(md.num_blocks))).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(3):
        x, y = (t.to(device) for t in md.batch(step, BATCH, SEED))
        opt.zero_grad()
        md.loss_fn(model(x), y).backward()
        opt.step()
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _simulated_ratios(ranks: int) -> dict[str, float]:
    """Makespan at unit costs (overlap factor 1: the halves one after the other) over zb-v's."""
    spans = {n: pipesched.simulate(pipesched.build_schedule(n, ranks, MICROBATCHES)).makespan for n in SCHEDULES}
    return {n: spans[n] / spans["zb-v"] for n in SCHEDULES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="processes (local runs)")
    parser.add_argument("--rounds", type=int, default=8, help="turns of each variant")
    parser.add_argument("--burst", type=int, default=3, help="steps of a variant per turn (after a warm-up step)")
    parser.add_argument("--streams", action="store_true", help="overlapped pairs on CUDA streams against sequential")
    args = parser.parse_args()
    worker = streams_worker if args.streams else compare_worker
    job = (args.rounds, args.burst)
    started = perf_counter()
    result = run_torchrun(worker, job, 1200) if under_torchrun() else spawn(worker, args.ranks, job, 1200)[0]
    if result is None:  # a torchrun rank other than 0
        return 0
    ranks = int(os.environ["WORLD_SIZE"]) if under_torchrun() else args.ranks
    if args.streams:
        ok = True
        print("| schedule | ranks | pair halves on two streams | param error, streams | param error, sequential | "
              "step time streams / sequential |")
        print("|---|---|---|---|---|---|")
        for name, used, on, off, ratio in result:
            ok &= max(on, off) < TOL
            print(f"| {name} | {ranks} | {'yes' if used else 'no (not CUDA)'} | {on:.1e} | {off:.1e} | {ratio:.3f} |")
        print("overlap streams equivalence:", "PASS" if ok else "FAIL", f"(tolerance {TOL:g} relative)")
        return 0 if ok else 1
    simulated = _simulated_ratios(ranks)
    zbv = result["zb-v"]
    print(f"mlp {MODEL}, batch {BATCH}, m={MICROBATCHES}, {ranks} ranks, {args.rounds} turns x {args.burst} steps "
          f"({perf_counter() - started:.0f} s)\n")
    print("| schedule | median step (ms) | step / zb-v's (median of turns) | simulated / zb-v's (unit costs) |")
    print("|---|---|---|---|")
    for name in (*SCHEDULES, SUM_AT_END):
        turns = result[name]
        ratio = statistics.median(a / b for a, b in zip(turns, zbv))
        print(f"| {name} | {1000 * statistics.median(turns):.1f} | {ratio:.3f} | {simulated.get(name, simulated['dualpipe']):.3f} |")
    overlapped = statistics.median(a / b for a, b in zip(result["dualpipe"], result[SUM_AT_END]))
    print(f"\ndualpipe, copies summed while the pipeline drains / after the last action: {overlapped:.3f}")
    print(f"dualpipe's gradient sum of the two copies (all-reduces per pair of ranks), alone: "
          f"{1000 * result['copy sum'][0]:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
