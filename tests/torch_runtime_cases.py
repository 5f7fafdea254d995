"""Workers that train with torch.distributed.pipelining's own runtime (spawned processes import
them by module name): torch runs the program pipesched writes."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
from runtime_cases import STEPS  # the reference's

from pipesched.runtime.stages.copies import balanced_block_counts
from pipesched.runtime.stages.partition import build_stage, stage_block_ranges
from pipesched.runtime.training.models import get_model
from pipesched.schedule_files import csv_text

SEED, LR = 3, 0.05  # the reference's


def torch_runs_compute_comms(rank: int, world: int, job: tuple) -> dict:
    """For each (label, schedule): write its compute_comms CSV, load it into torch's
    ``_PipelineScheduleRuntime`` with ``format="compute_comms"`` and train STEPS steps of SGD.
    A schedule of fewer ranks than the world runs on a group of consecutive ranks, the groups
    sharing out such schedules. Rank 0 returns each run's losses, first-step gradients and final
    parameters (unpipelined names), and the program torch ran, row by row."""
    model, size, batch, runs = job
    md = get_model(model, **size)
    folder = tempfile.mkdtemp(prefix=f"pipesched-rank{rank}-")
    mine = {}
    for ranks in sorted({schedule.ranks for _, schedule in runs}, reverse=True):
        blocks = [list(range(start, start + ranks)) for start in range(0, world - ranks + 1, ranks)]
        groups = [dist.new_group(members) for members in blocks]  # every rank creates every group
        index = next(g for g, members in enumerate(blocks) if rank in members)
        shared = [run for run in runs if run[1].ranks == ranks][index::len(blocks)]
        for label, schedule in shared:
            mine[label] = _train(md, batch, schedule, groups[index], os.path.join(folder, f"{label}.csv"))
    parts = [None] * world
    dist.all_gather_object(parts, {label: result for label, result in mine.items() if result is not None})
    return {label: result for part in parts for label, result in part.items()} if rank == 0 else {}


def _train(md, batch: int, schedule, group, path: str):
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    rank = dist.get_rank(group)
    with open(path, "w", newline="") as f:
        f.write(csv_text(schedule, "compute_comms"))
    ranges = stage_block_ranges(md.num_blocks, schedule.stages, balanced_block_counts(md.block_costs, schedule))
    owned = {s: build_stage(md.build_block, ranges[s], s, SEED, torch.device("cpu"))
             for s, r in enumerate(schedule.placement) if r == rank}
    stages = [PipelineStage(module, s, schedule.stages, torch.device("cpu"), group=group) for s, module in owned.items()]
    runtime = _PipelineScheduleRuntime(stages, schedule.microbatches, loss_fn=md.loss_fn)
    runtime._load_csv(path, format="compute_comms")
    optimizer = torch.optim.SGD([p for module in owned.values() for p in module.parameters()], lr=LR)
    losses, grads = [], None
    for step in range(STEPS):
        x, y = md.batch(step, batch, SEED)
        mb_losses: list = []
        runtime.step(*((x,) if 0 in owned else ()), target=y if schedule.stages - 1 in owned else None,
                     losses=mb_losses, return_outputs=False)
        loss = torch.stack(mb_losses).detach().mean().reshape(1) if mb_losses else torch.zeros(1)
        dist.all_reduce(loss, group=group)  # only the last stage's rank holds it
        losses.append(float(loss))
        if step == 0:
            grads = _gathered({n: p.grad.clone() for m in owned.values() for n, p in m.global_named_parameters()}, group)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    params = _gathered({k: v for m in owned.values() for k, v in m.global_state_dict().items()}, group)
    ran = [None] * dist.get_world_size(group)
    dist.all_gather_object(ran, [str(a) for a in runtime.pipeline_order_with_comms[rank]], group=group)
    if rank != 0:
        return None
    return {"losses": losses, "grads": grads, "params": params, "program": ran}


def _gathered(local: dict, group) -> dict:
    parts = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, local, group=group)
    return {k: v for part in parts for k, v in part.items()}
