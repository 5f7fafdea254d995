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
from pipesched.training.models import get_model
from pipesched.schedule_files import csv_text

SEED, LR = 3, 0.05  # the reference's


def torch_runs_compute_comms(rank: int, world: int, job: tuple) -> dict:
    """For each (label, schedule): write its compute_comms CSV, load it into torch's
    ``_PipelineScheduleRuntime`` with ``format="compute_comms"`` and train STEPS steps of SGD.
    A schedule of fewer ranks than the world runs on a group of consecutive ranks, the groups
    sharing out such schedules. Then, in the same launch, each (label, schedule, programs) of
    ``sharded`` on FSDP2 stages at pp 2 x dp_shard 2 (:func:`_train_sharded`). Rank 0 returns each
    run's losses, first-step gradients and final parameters (unpipelined names), and the program
    torch ran, row by row."""
    model, size, batch, runs, *rest = job
    sharded = rest[0] if rest else []
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
    if sharded:
        from pipesched.parallel_layout import runtime_layout
        from pipesched.runtime.sharding import sharded_mesh

        mesh = sharded_mesh.init_sharded_mesh(runtime_layout(pp=2, dp_shard=2), 60)
        for label, schedule, programs in sharded:
            mine[label] = _train_sharded(md, batch, schedule, programs, mesh, os.path.join(folder, f"{label}.csv"))
    parts = [None] * world
    dist.all_gather_object(parts, {label: result for label, result in mine.items() if result is not None})
    return {label: result for part in parts for label, result in part.items()} if rank == 0 else {}


def _train(md, batch: int, schedule, group, path: str):
    rank = dist.get_rank(group)
    ranges = stage_block_ranges(md.num_blocks, schedule.stages, balanced_block_counts(md.block_costs, schedule))
    owned = {s: build_stage(md.build_block, ranges[s], s, SEED, torch.device("cpu"))
             for s, r in enumerate(schedule.placement) if r == rank}
    return _torch_steps(md, batch, schedule, None, owned, (rank, group), path)


def _torch_steps(md, batch: int, schedule, programs, owned: dict, pipeline: tuple, path: str,
                 shards: int = 1, shard=lambda t: t):
    """STEPS steps of SGD in torch's runtime from ``schedule``'s compute_comms CSV (``programs``, or
    the default lowering's) on ``owned`` stages; ``pipeline``: (this rank's pipeline rank, its
    pipeline's group). With ``shards`` > 1 the stages are FSDP-sharded (gradients and weights are
    gathered whole) and each rank trains on its ``shard`` of the batch. Rank 0 of the ranks taking
    part returns the losses, first-step gradients, final parameters and the program torch ran."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    pp_rank, group = pipeline
    everyone = None if shards > 1 else group  # the ranks taking part
    whole = (lambda t: t.full_tensor()) if shards > 1 else (lambda t: t)
    with open(path, "w", newline="") as f:
        f.write(csv_text(schedule, "compute_comms", programs))
    stages = [PipelineStage(module, s, schedule.stages, torch.device("cpu"), group=group) for s, module in owned.items()]
    runtime = _PipelineScheduleRuntime(stages, schedule.microbatches, loss_fn=md.loss_fn)
    runtime._load_csv(path, format="compute_comms")
    optimizer = torch.optim.SGD([p for module in owned.values() for p in module.parameters()], lr=LR)
    losses, grads = [], None
    for step in range(STEPS):
        x, y = (shard(t) for t in md.batch(step, batch, SEED))
        mb_losses: list = []
        runtime.step(*((x,) if 0 in owned else ()), target=y if schedule.stages - 1 in owned else None,
                     losses=mb_losses, return_outputs=False)
        loss = torch.stack(mb_losses).detach().mean().reshape(1) if mb_losses else torch.zeros(1)
        dist.all_reduce(loss, group=everyone)  # only the last stage's ranks hold it, each its shard's mean
        losses.append(float(loss) / shards)
        if step == 0:
            grads = _gathered({n: whole(p.grad) for m in owned.values() for n, p in m.global_named_parameters()}, everyone)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    params = _gathered({k: whole(v) for m in owned.values() for k, v in m.global_state_dict().items()}, everyone)
    ran = [None] * dist.get_world_size(everyone)
    dist.all_gather_object(ran, (pp_rank, [str(a) for a in runtime.pipeline_order_with_comms[pp_rank]]), group=everyone)
    if dist.get_rank(everyone) != 0:
        return None
    return {"losses": losses, "grads": grads, "params": params, "program": [cells for _, cells in sorted(dict(ran).items())]}


def _gathered(local: dict, group) -> dict:
    parts = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, local, group=group)
    return {k: v for part in parts for k, v in part.items()}


def _train_sharded(md, batch: int, schedule, programs, mesh, path: str):
    """One run of ``schedule``'s compute_comms CSV (``programs``' placement of the gathers, or the
    default lowering's) in torch's runtime, each stage ``fully_shard``-ed block by block and as a
    whole over its pipeline position's two shards, kept gathered from forward to backward (as
    torchtitan runs FSDP under pipelining). gloo has no AVG or PREMUL_SUM: the reductions are
    forced to SUM, after which FSDP divides by the shards; torch's REDUCE_GRAD then divides by the
    microbatches (``scale_grads``), so the gradient is the whole batch's mean."""
    from torch.distributed.fsdp import fully_shard

    from pipesched.runtime.sharding.sharding import fsdp_modules

    pp_rank = mesh.pipeline.pp_rank
    ranges = stage_block_ranges(md.num_blocks, schedule.stages, balanced_block_counts(md.block_costs, schedule))
    owned = {}
    for s, r in enumerate(schedule.placement):
        if r == pp_rank:
            module = build_stage(md.build_block, ranges[s], s, SEED, torch.device("cpu"))
            for block in module.blocks.values():
                fully_shard(block, mesh=mesh.dp_mesh, reshard_after_forward=False)
            owned[s] = fully_shard(module, mesh=mesh.dp_mesh, reshard_after_forward=False)
            for sub in fsdp_modules(module):
                sub.set_force_sum_reduction_for_comms(True)
    return _torch_steps(md, batch, schedule, programs, owned, (pp_rank, mesh.pipeline.pp_group), path,
                        shards=mesh.layout.dp_shard, shard=mesh.pipeline.shard)
