"""A checkpoint of a sharded stage read back sharded and whole (part of tests/sharded_cases.py's
launch, for the plans that split fused projections into interleaved pieces)."""

from __future__ import annotations

import copy
import os
import shutil
import tempfile

import torch


def checkpoint_round_trip(template, plan, mesh, trained) -> float:
    """The largest difference of the weights and AdamW moments of ``trained`` (a sharded stage
    and its optimizer) from those of a checkpoint of it loaded into a fresh sharded copy and into
    the unsharded ``template`` (what one process reads): 0 when DCP placed every piece."""
    from pipesched.runtime.checkpoints import checkpoint
    from pipesched.runtime.sharding.sharding import full_tensor, shard_stage

    stage, optimizer = trained
    folder = os.path.join(tempfile.gettempdir(), f"pipesched-sharded-{os.getppid()}")
    path = checkpoint.save(folder, 1, stage, optimizer)
    sharded = copy.deepcopy(template)
    shard_stage(sharded, mesh, plan)
    whole = copy.deepcopy(template)
    worst = 0.0
    for model in (sharded, whole):
        again = torch.optim.AdamW(model.parameters(), lr=1e-3)
        checkpoint.load(path, model, again)
        for p, q in zip(stage.parameters(), model.parameters()):
            pairs = [(p, q)] + [(optimizer.state[p][k], again.state[q][k]) for k in ("exp_avg", "exp_avg_sq")]
            worst = max(worst, *(float((full_tensor(a.detach()) - full_tensor(b.detach())).abs().max()) for a, b in pairs))
    torch.distributed.barrier()  # every rank has read it
    if torch.distributed.get_rank() == 0:
        shutil.rmtree(folder, ignore_errors=True)
    return worst
