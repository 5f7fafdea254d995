"""Equivalence check: every registered schedule against the single-process model, on any backend.

Locally it spawns gloo ranks on CPU; under torchrun it uses NCCL on CUDA (one device per rank).
Prints the largest relative error of loss, gradients (step 1) and parameters (after 3 SGD steps)
per schedule and exits 1 if any is above 1e-5 (fp32). With ``--dp D`` the processes form D
replicas of a pipeline of world/D ranks (a 2D mesh), each on its shard of the same global batch.

    PYTHONPATH=src python benchmarks/equivalence.py --ranks 2
    torchrun --nproc-per-node 2 benchmarks/equivalence.py
    torchrun --nproc-per-node 4 benchmarks/equivalence.py --dp 2
"""

from __future__ import annotations

import argparse
import sys

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
from pipesched.runtime.stages.partition import build_block_seeded
from pipesched.training.models import get_model

SIZE = dict(blocks=7, dim=64, hidden=128)
BATCH, MICROBATCHES, STEPS, SEED, LR, TOL = 16, 4, 3, 3, 0.05, 1e-5


def _reference(device: torch.device) -> dict:
    md = get_model("mlp", **SIZE)
    model = torch.nn.Sequential(*(build_block_seeded(md.build_block, i, SEED) for i in range(md.num_blocks))).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = {}
    for step in range(STEPS):
        x, y = (t.to(device) for t in md.batch(step, BATCH, SEED))
        opt.zero_grad()
        loss = md.loss_fn(model(x), y)
        loss.backward()
        if step == 0:
            out["loss"] = loss.item()
            out["grads"] = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}
        opt.step()
    out["params"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return out


def _rel(got: dict, want: dict) -> float:
    return max(float((got[k] - want[k]).abs().max() / want[k].abs().max().clamp_min(1e-30)) for k in want)


def worker(rank: int, world: int, dp: int) -> list:
    from pipesched.runtime.comm.mesh import init_pipeline_mesh

    device = rank_device()
    md = get_model("mlp", **SIZE)
    ref = _reference(device) if rank == 0 else None
    mesh = init_pipeline_mesh(world // dp, dp)
    rows = []
    for family in pipesched.families():
        try:
            schedule = pipesched.build_schedule(family.name, world // dp, MICROBATCHES)
        except ConfigError:  # a family that does not build on these ranks (dualpipe on one: it pairs ranks)
            continue
        x0, _ = md.batch(0, BATCH, SEED)
        rt = PipelineRuntime(
            StagedModel(md.build_block, md.num_blocks, x0[: BATCH // (dp * MICROBATCHES)]),
            schedule, md.loss_fn, lambda ps: torch.optim.SGD(ps, lr=LR), mesh=mesh,
            options=RuntimeOptions(seed=SEED, device=device, timeout_s=120),
        )
        x, y = md.batch(0, BATCH, SEED)
        first_loss = rt.step(x, y).loss
        grads = rt.gather_gradients()
        for step in range(1, STEPS):
            rt.step(*md.batch(step, BATCH, SEED))
        params = rt.gather_state_dict()
        if rank == 0:
            rows.append((family.name, abs(first_loss - ref["loss"]) / abs(ref["loss"]), _rel(grads, ref["grads"]), _rel(params, ref["params"])))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="processes in all (local runs)")
    parser.add_argument("--dp", type=int, default=1, help="data-parallel replicas among them")
    args = parser.parse_args()
    rows = run_torchrun(worker, args.dp, 300) if under_torchrun() else spawn(worker, args.ranks, args.dp, 300)[0]
    if not rows:
        return 0
    ok = True
    print("| schedule | loss rel. err | grad rel. err | param rel. err (3 steps) |")
    print("|---|---|---|---|")
    for name, loss_err, grad_err, param_err in rows:
        ok &= max(loss_err, grad_err, param_err) < TOL
        print(f"| {name} | {loss_err:.2e} | {grad_err:.2e} | {param_err:.2e} |")
    print("equivalence:", "PASS" if ok else "FAIL", f"(tolerance {TOL:g} relative)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
