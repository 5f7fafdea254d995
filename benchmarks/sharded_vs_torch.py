"""Sharded stages at pp 2 x dp_shard 2: torch's own pipelining with FSDP2 stages, timed, and
(``--check``) the exactness cases of tests/test_sharded_stages.py on this launch's backend: its
4-rank cases, then (locally, or under a torchrun of 8) its 8-rank ones (HSDP x tp).

Run: PYTHONPATH=src python benchmarks/sharded_vs_torch.py [--rounds N] [--check]   (4 local gloo processes; 8 for the 8-rank check)
     torchrun --nproc-per-node 4 benchmarks/sharded_vs_torch.py [--check]           (NCCL, one GPU per rank)

The torch side is what a torch user writes: the built-in gpt's blocks cut into the same stages
pipesched cuts them into (``balanced_block_counts``), the same seeded weights, each stage
``fully_shard``-ed block by block and as a whole over the ``dp_shard`` ranks of its pipeline
position (kept gathered between forward and backward, torchtitan's choice under pipelining), run
by ``Schedule1F1B`` and ``ScheduleZBVZeroBubble`` (which unshard, reshard and reduce the
gradients themselves), AdamW. The ranks are placed as pipesched's runtime places them
(:data:`pipesched.runtime.sharding.sharded_mesh.RUNTIME_ORDER`). Each variant takes turns with the others
on the same processes (the machine is noisy): step times are the slowest rank's, medians of
``rounds`` turns of ``BURST`` steps. Before timing, every variant's first loss is checked against
the unsharded model's on the same batch.

pipesched's side is ``PipelineRuntime`` over the same mesh (``mesh=init_sharded_mesh(...)``): the
same stages, weights, batches and AdamW, its program's UNSHARD/RESHARD/REDUCE_GRAD driving FSDP.
The table pairs each ours/torch ratio turn by turn (the median and quartiles of the per-turn
ratios). gloo timings say nothing about NCCL: on CPU its reduce-scatter is an all-reduce.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from time import perf_counter

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import pipesched  # noqa: E402
from pipesched.parallel_layout import runtime_layout  # noqa: E402
from pipesched.runtime.launching.launch import (  # noqa: E402
    rank_device,
    run_torchrun,
    spawn,
    under_torchrun,
)
from pipesched.runtime.sharding.sharded_mesh import init_sharded_mesh  # noqa: E402
from pipesched.runtime.stages.copies import balanced_block_counts  # noqa: E402
from pipesched.runtime.stages.partition import build_stage, stage_block_ranges  # noqa: E402
from pipesched.training.models import gpt_model  # noqa: E402

LAYOUT = dict(pp=2, dp_shard=2)
SIZE = dict(layers=6, dim=64, heads=4, context=32)
BATCH, MICROBATCHES, SEED, LR = 16, 4, 3, 1e-3
BURST = 2
VARIANTS = {"torch 1f1b": ("1f1b", "Schedule1F1B"), "torch zb-v": ("zb-v", "ScheduleZBVZeroBubble"),
            "pipesched 1f1b": ("1f1b", None), "pipesched zb-v": ("zb-v", None)}
PAIRS = (("pipesched 1f1b", "torch 1f1b"), ("pipesched zb-v", "torch zb-v"))


def torch_fsdp_stages(md, schedule, mesh, device) -> dict:
    """This rank's stages of ``schedule``, each FSDP2-sharded over its position's dp_shard ranks."""
    from torch.distributed.fsdp import fully_shard

    ranges = stage_block_ranges(md.num_blocks, schedule.stages, balanced_block_counts(md.block_costs, schedule))
    owned = {}
    for s, r in enumerate(schedule.placement):
        if r == mesh.pipeline.pp_rank:
            module = build_stage(md.build_block, ranges[s], s, SEED, device)
            for block in module.blocks.values():
                fully_shard(block, mesh=mesh.dp_mesh, reshard_after_forward=False)
            owned[s] = fully_shard(module, mesh=mesh.dp_mesh, reshard_after_forward=False)
    return owned


def torch_runner(md, name: str, cls_name: str, mesh, device):
    """step(x, y) -> (seconds, this rank's mean microbatch loss or None) for torch's schedule."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as ts

    schedule = pipesched.build_schedule(name, LAYOUT["pp"], MICROBATCHES)
    owned = torch_fsdp_stages(md, schedule, mesh, device)
    stages = [PipelineStage(m, s, schedule.stages, device, group=mesh.pipeline.pp_group) for s, m in owned.items()]
    cls = getattr(ts, cls_name)
    single = issubclass(cls, ts.PipelineScheduleSingle)
    sched = cls(stages[0] if single else stages, n_microbatches=MICROBATCHES, loss_fn=md.loss_fn)
    optimizer = torch.optim.AdamW([p for m in owned.values() for p in m.parameters()], lr=LR)
    first, last = 0 in owned, schedule.stages - 1 in owned

    def step(x, y):
        x, y = mesh.pipeline.shard(x).to(device), mesh.pipeline.shard(y).to(device)
        losses: list = []
        dist.barrier()
        t0 = perf_counter()
        sched.step(*((x,) if first else ()), **(dict(target=y, losses=losses) if last else {}), return_outputs=False)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        took = perf_counter() - t0
        return took, (float(torch.stack(losses).detach().mean()) if losses else None)

    return step


def our_runner(md, name: str, mesh, device):
    """step(x, y) -> (seconds, the step's loss on the last stage's ranks, else None) for pipesched."""
    from pipesched.runtime.executor import PipelineRuntime
    from pipesched.runtime.stages.staged_model import StagedModel
    from pipesched.runtime.options import RuntimeOptions

    schedule = pipesched.build_schedule(name, LAYOUT["pp"], MICROBATCHES)
    x0, _ = md.batch(0, BATCH, SEED)
    model = StagedModel(md.build_block, md.num_blocks, x0[: BATCH // (LAYOUT["dp_shard"] * MICROBATCHES)],
                        block_counts=balanced_block_counts(md.block_costs, schedule))
    rt = PipelineRuntime(model, schedule, md.loss_fn, lambda ps: torch.optim.AdamW(ps, lr=LR),
                         options=RuntimeOptions(seed=SEED, device=device),
                         mesh=mesh)
    last = schedule.placement[-1] == mesh.pipeline.pp_rank

    def step(x, y):
        result = rt.step(x, y)
        return result.step_time, (result.loss if last else None)

    return step


def bench_worker(rank: int, world: int, rounds: int) -> dict:
    device = rank_device()
    mesh = init_sharded_mesh(runtime_layout(**LAYOUT), 300, device_type=device.type)
    md = gpt_model(**SIZE)
    runners = {label: (torch_runner(md, name, cls, mesh, device) if cls else our_runner(md, name, mesh, device))
               for label, (name, cls) in VARIANTS.items()}
    batches = [md.batch(i, BATCH, SEED) for i in range(BURST + 1)]
    first_losses = {label: run(*batches[0])[1] for label, run in runners.items()}  # also the warm-up
    times: dict = {label: [] for label in runners}
    for _ in range(rounds):
        for label, run in runners.items():
            times[label] += [run(*batches[1 + j])[0] for j in range(BURST)]
    parts = [None] * world
    dist.all_gather_object(parts, {"times": times, "losses": first_losses})
    return {"times": {k: [max(p["times"][k][i] for p in parts) for i in range(len(times[k]))] for k in times},
            "losses": {k: statistics.mean(p["losses"][k] for p in parts if p["losses"][k] is not None) for k in times}}


def reference_loss(md) -> float:
    """The unsharded model's loss on the first batch (the mean over its samples)."""
    x, y = md.batch(0, BATCH, SEED)
    with torch.no_grad():
        return float(md.loss_fn(md.sequential(SEED)(x), y))


def timing_table(result: dict) -> list[str]:
    md = gpt_model(**SIZE)
    want = reference_loss(md)
    lines = [f"pp {LAYOUT['pp']} x dp_shard {LAYOUT['dp_shard']}, gpt {SIZE}, global batch {BATCH}, "
             f"{MICROBATCHES} microbatches per data-parallel rank, AdamW; slowest rank's step, median of the turns.", "",
             "| variant | first loss - unsharded loss | median step (ms) | steps timed |", "|---|---|---|---|"]
    for label, times in result["times"].items():
        error = result["losses"][label] - want
        if abs(error) > 1e-4 * abs(want):  # fp32, a reordered mean: far below this
            raise SystemExit(f"{label}: first loss {result['losses'][label]} differs from the unsharded {want}")
        lines.append(f"| {label} | {error:+.1e} | {1000 * statistics.median(times):.1f} | {len(times)} |")
    lines += ["", "| pair | ours/torch, median of the turns (quartiles) |", "|---|---|"]
    for ours, theirs in PAIRS:
        ratios = sorted(a / b for a, b in zip(result["times"][ours], result["times"][theirs]))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        lines.append(f"| {ours} / {theirs} | {statistics.median(ratios):.2f} ({q[0]:.2f}-{q[2]:.2f}) |")
    return lines


def check_cases(world: int) -> dict:
    """tests/test_sharded_stages.py's exactness cases of a launch of ``world`` ranks."""
    from test_sharded_stages import ALL_CASES, EIGHT_RANK_CASES

    return {4: ALL_CASES, 8: EIGHT_RANK_CASES}.get(world, {})


def check_worker(rank: int, world: int, _payload=None) -> dict:
    """The exactness cases of ``world`` ranks on this launch's device and backend."""
    from sharded_cases import several_layouts

    parts = [None] * world
    dist.all_gather_object(parts, several_layouts(rank, world, check_cases(world), str(rank_device())))
    return dict(enumerate(parts))


def check_table(ranks: dict) -> list[str]:
    from test_sharded_stages import GRAD_TOLERANCE, layout_of

    from pipesched.sharded_bytes import rank_state_bytes

    lines = ["| layout | model | rank | grad error | weight error | split - fused | bytes measured / predicted |",
             "|---|---|---|---|---|---|---|"]
    failed = False
    for r, cases in sorted(ranks.items()):
        for label, case in cases.items():
            tp_rank, shard_rank = case["coordinates"]
            for kind in check_cases(len(ranks))[label][1]:
                c = case[kind]
                p = rank_state_bytes(c["specs"], layout_of(label), tp_rank, shard_rank)
                ratio = sum(c["bytes"].values()) / (p.params + p.grads + p.optimizer)
                failed |= c["grad_error"] >= GRAD_TOLERANCE or abs(ratio - 1) > 0.02
                lines.append(f"| {label} | {kind} | {r} | {c['grad_error']:.1e} | {c['weight_error']:.1e} | "
                             f"{c['split_vs_fused']:.1e} | {ratio:.4f} |")
    if failed:
        lines.append("FAILED: a gradient or a byte count outside its bound")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="also run the exactness cases")
    args = parser.parse_args()
    checks = [(check_worker, None, check_table, world) for world in (4, 8)] if args.check else []
    for worker, payload, table, world in [*checks, (bench_worker, args.rounds, timing_table, 4)]:
        if under_torchrun():
            if world != int(os.environ["WORLD_SIZE"]):
                continue  # a torchrun launch runs the jobs of its own size
            result = run_torchrun(worker, payload, 600)
            if int(os.environ["RANK"]) != 0:
                continue
        else:
            result = spawn(worker, world, payload, timeout_s=900)[0]
        lines = table(result)
        print("\n".join(lines) + "\n", flush=True)
        if any(line.startswith("FAILED") for line in lines):
            raise SystemExit(1)


if __name__ == "__main__":
    main()
