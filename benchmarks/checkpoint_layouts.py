"""Checkpoints across layouts: a gpt run saved at pp 2 x dp_shard 2 (FSDP2 inside the stages, its
model and optimizer state DTensors) resumes at pp 2 x tp 2, at pp 4 and in one process, and a
one-process run's checkpoint resumes at pp 2 x dp_shard 2.

    PYTHONPATH=src python benchmarks/checkpoint_layouts.py [--check]    (4 local gloo processes)
    torchrun --nproc-per-node 4 benchmarks/checkpoint_layouts.py --check  (NCCL, one GPU per rank)

The checkpoint is DCP's (``runtime/checkpoints/checkpoint.py``): each rank writes its shards
under the unsplit model's names, DCP records where each shard sits in the whole tensor, and a
rank of any other layout reads the pieces it now owns. Runs of 4 steps (SGD at lr 0.05, AdamW at
lr 1e-3) are saved after step 2 and carried on (the uninterrupted runs): in one process first,
then at pp 2 x dp_shard 2 in one launch of 4 processes that also runs every resumed layout in
turn; the one-process run resumed comes last. Each resumed run loads the step-2 checkpoint,
saves it again at once (nothing trained) and trains steps 3 and 4.

What ``--check`` asserts:

- the checkpoint each layout saves again right after loading holds every model and optimizer
  entry of the one it loaded, bit for bit (AdamW's moments and step included): the state moved
  exactly, whatever the layout;
- with SGD, the weights after step 4 of every resumed run within 1e-5 (relative to each tensor's
  largest entry) of the uninterrupted run whose checkpoint it loaded and of the one-process run:
  what differs is the order of fp32 sums (microbatches, shards, the row-parallel all-reduce), as
  between the layouts themselves (tests/test_sharded_pipelines.py);
- every resumed run's losses of steps 3 and 4 within 1e-5 relative of the uninterrupted run's.

AdamW's weights are reported, not asserted: its first steps move each weight by about ``lr``
whatever the size of its gradient, so an entry whose gradient is a rounding error away from
zero moves by up to ``2 lr`` in one layout against another, resumed or not (the column
"uninterrupted vs one process" shows the same spread without any checkpoint).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from time import perf_counter
from typing import Optional

import torch
import torch.distributed as dist

import pipesched
from pipesched.parallel_layout import runtime_layout
from pipesched.runtime.checkpoints import checkpoint
from pipesched.runtime.executor import PipelineRuntime
from pipesched.runtime.stages.staged_model import StagedModel
from pipesched.runtime.launching.launch import (
    rank_device,
    run_torchrun,
    spawn,
    under_torchrun,
)
from pipesched.runtime.options import RuntimeOptions
from pipesched.runtime.sharding.sharded_mesh import init_sharded_mesh
from pipesched.training.models import get_model
from pipesched.training.optimizers import make_optimizer
from pipesched.training.train import TrainConfig, run

SIZE = dict(layers=2, dim=32, heads=4, context=16)  # 4 blocks: one per rank at pp 4
BATCH, MICROBATCHES, SEED, STEPS, SAVED_AFTER = 16, 4, 0, 4, 2
LR = {"sgd": 0.05, "adamw": 1e-3}
SAVED_AT, SAVED_LABEL = (2, 2, 1), "pp 2 x dp_shard 2"  # (pp, dp_shard, tp)
RESUMED_AT = {"pp 2 x tp 2": (2, 1, 2), "pp 4": (4, 1, 1)}
ONE, RESUMED_ONE, FROM_ONE = "one process", "one process (resumed)", "pp 2 x dp_shard 2 (resumed)"
TOL = 1e-5


def _runtime(layout: tuple, optimizer: str, mesh) -> PipelineRuntime:
    md = get_model("gpt", **SIZE)
    pp, _, tp = layout
    x0, _ = md.batch(0, BATCH, SEED)
    model = StagedModel(md.build_block, md.num_blocks, x0[: BATCH // (layout[1] * MICROBATCHES)],
                        tp_plan=md.tp_plan if tp > 1 else None)
    return PipelineRuntime(model, pipesched.build_schedule("1f1b", pp, MICROBATCHES), md.loss_fn,
                           make_optimizer(optimizer, LR[optimizer]), mesh=mesh,
                           options=RuntimeOptions(seed=SEED, timeout_s=300, device=rank_device()))


def layout_run(layout: tuple, folder: Path, load: Optional[Path]) -> dict:
    """One layout's runs, one per optimizer: load ``load``'s checkpoint (if any) and save it again
    at once, train up to STEPS (saving after SAVED_AFTER when nothing was loaded); each run's
    losses and its final weights, gathered whole on rank 0 (None elsewhere)."""
    pp, dp_shard, tp = layout
    mesh = init_sharded_mesh(runtime_layout(pp, 1, dp_shard, tp), 300, rank_device().type) if dp_shard * tp > 1 else None
    md = get_model("gpt", **SIZE)
    out = {}
    for optimizer in LR:
        rt = _runtime(layout, optimizer, mesh)
        if load is not None:
            rt.load_checkpoint(checkpoint.step_dir(load / optimizer, SAVED_AFTER))
            rt.save_checkpoint(folder / optimizer / "again")
        losses = []
        while rt.steps_done < STEPS:
            losses.append(rt.step(*md.batch(rt.steps_done, BATCH, SEED)).loss)
            if rt.steps_done == SAVED_AFTER and load is None:
                rt.save_checkpoint(folder / optimizer)
        params = rt.gather_state_dict()
        out[optimizer] = {"losses": losses, "params": params and {k: v.cpu() for k, v in params.items()}}
    return out


def check_worker(rank: int, world: int, folder: Optional[str]) -> Optional[dict]:
    """Every layout of one launch of 4 processes, in turn: saved at SAVED_AT, resumed at each of
    RESUMED_AT, and SAVED_AT resuming the one-process run's checkpoint. Rank 0 returns the
    results. The folder is rank 0's (under torchrun the others are given None)."""
    told = [folder]
    dist.broadcast_object_list(told)
    root = Path(told[0])
    results = {SAVED_LABEL: layout_run(SAVED_AT, root / SAVED_LABEL, None)}
    for label, layout in RESUMED_AT.items():
        results[label] = layout_run(layout, root / label, root / SAVED_LABEL)
    results[FROM_ONE] = layout_run(SAVED_AT, root / FROM_ONE, root / ONE)
    return results if rank == 0 else None


def _one_process_config(optimizer: str, **more) -> TrainConfig:
    return TrainConfig("gpt", None, STEPS, BATCH, RuntimeOptions(seed=SEED), lr=LR[optimizer], optimizer=optimizer,
                       model_size=SIZE, want_params=True, **more)


def one_process_uninterrupted(folder: Path) -> dict:
    """The one-process runs (``train --schedule none``'s), uninterrupted, saved after step
    SAVED_AFTER (the checkpoint SAVED_AT resumes); their losses and final weights."""
    out = {}
    for optimizer in LR:
        whole = run(_one_process_config(optimizer, checkpoint_dir=str(folder / optimizer), checkpoint_every=SAVED_AFTER))
        out[optimizer] = {"losses": whole.losses, "params": whole.params}
    return out


def one_process_resumed(folder: Path, load: Path) -> dict:
    """The one-process runs resumed from ``load``'s checkpoint (loaded and saved again at once,
    as the layouts do); their losses of the steps after it and final weights."""
    md = get_model("gpt", **SIZE)
    out = {}
    for optimizer in LR:
        saved = checkpoint.step_dir(load / optimizer, SAVED_AFTER)
        model = md.sequential(SEED)
        view = checkpoint.tied_view(model, md.tied, md.checkpoint_name)
        state = make_optimizer(optimizer, LR[optimizer])(list(model.parameters()))
        checkpoint.load(saved, view, state)
        checkpoint.save(folder / optimizer / "again", SAVED_AFTER, view, state)
        resumed = run(_one_process_config(optimizer, resume_from=str(saved)))
        out[optimizer] = {"losses": resumed.losses, "params": resumed.params}
    return out


def entries(folder: Path) -> dict:
    """Every model and optimizer entry of checkpoint ``folder`` (tensors whole, settings as they
    are), by its flattened name."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as scratch:
        dcp_to_torch_save(str(folder), f"{scratch}/whole.pt")
        state = torch.load(f"{scratch}/whole.pt", weights_only=False)
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), sub)
        else:
            flat[prefix] = value

    walk("", {k: v for k, v in state.items() if k != "rng"})
    return flat


def relative_error(got: dict, want: dict) -> float:
    """The largest difference of any tensor, relative to that tensor's largest entry."""
    return max(float((got[k] - want[k]).abs().max() / want[k].abs().max().clamp_min(1e-30)) for k in want)


def loss_error(got: list, want: list) -> float:
    return max(abs(g - w) / abs(w) for g, w in zip(got, want))


def moved_exactly(saved: dict, again: dict) -> bool:
    def same(a, b) -> bool:
        return torch.equal(a, b) if isinstance(a, torch.Tensor) else type(a) is type(b) and a == b

    return saved.keys() == again.keys() and all(same(saved[k], again[k]) for k in saved)


def _compare(results: dict, folder: Path, optimizer: str, label: str, source: str) -> tuple[str, list[str]]:
    """One resumed run against the uninterrupted run whose checkpoint it loaded (``source``) and
    against the uninterrupted one-process run: its line, and what failed."""
    got, start, ref = results[label][optimizer], results[source][optimizer], results[ONE][optimizer]
    saved = entries(checkpoint.step_dir(folder / source / optimizer, SAVED_AFTER))
    exact = moved_exactly(saved, entries(checkpoint.step_dir(folder / label / optimizer / "again", SAVED_AFTER)))
    vs_run, vs_one = relative_error(got["params"], start["params"]), relative_error(got["params"], ref["params"])
    losses = loss_error(got["losses"], start["losses"][SAVED_AFTER:])
    line = (f"  {source + ' -> ' + label:<48} state loaded bit for bit: {'yes' if exact else 'NO'} ({len(saved)} entries)   "
            f"weights after step {STEPS} vs uninterrupted {vs_run:.1e}, vs one process {vs_one:.1e}   losses {losses:.1e}")
    failed = [] if exact else [f"{optimizer} {source} -> {label}: the state loaded differs from the state saved"]
    if losses > TOL or (optimizer == "sgd" and max(vs_run, vs_one) > TOL):
        failed.append(f"{optimizer} {source} -> {label}: resumed differs from uninterrupted beyond {TOL:g}")
    return line, failed


def table(results: dict, folder: Path) -> list[str]:
    """One line per resumed run; a FAILED line where a check does not hold."""
    lines, failed = [], []
    for optimizer, lr in LR.items():
        base = relative_error(results[ONE][optimizer]["params"], results[SAVED_LABEL][optimizer]["params"])
        lines.append(f"{optimizer} (lr {lr:g}), saved after step {SAVED_AFTER}; uninterrupted {SAVED_LABEL} vs {ONE}: "
                     f"weights {base:.1e}")
        for label, source in [*((label, SAVED_LABEL) for label in [*RESUMED_AT, RESUMED_ONE]), (FROM_ONE, ONE)]:
            line, why = _compare(results, folder, optimizer, label, source)
            lines.append(line)
            failed += why
    return lines + [f"FAILED: {why}" for why in failed]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 unless every check of the docstring holds")
    args = parser.parse_args()
    t0 = perf_counter()
    lead = not under_torchrun() or int(os.environ["RANK"]) == 0
    folder = Path(tempfile.mkdtemp(prefix="pipesched-ckpt-layouts-")) if lead else None
    try:
        before = one_process_uninterrupted(folder / ONE) if lead else None
        if under_torchrun():
            results = run_torchrun(check_worker, None if folder is None else str(folder), 900)
            if not lead:
                return 0
        else:
            results = spawn(check_worker, 4, str(folder), timeout_s=900)[0]
        results[ONE] = before
        results[RESUMED_ONE] = one_process_resumed(folder / RESUMED_ONE, folder / SAVED_LABEL)
        lines = table(results, folder)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    print("\n".join(lines) + f"\n({perf_counter() - t0:.0f} s, 4 processes on {rank_device_name()})")
    return 1 if args.check and any(line.startswith("FAILED") for line in lines) else 0


def rank_device_name() -> str:
    return "GPUs (NCCL)" if under_torchrun() and torch.cuda.is_available() else "CPU (gloo)"


if __name__ == "__main__":
    sys.exit(main())
