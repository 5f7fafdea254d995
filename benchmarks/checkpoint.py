"""What reliability costs: a checkpoint save (its checksum manifest included) and load, verifying
a checkpoint against its manifest, the per-step weight guard and the step-start agreement that
every rank's batch is usable, against the step time of the same run (2 gloo ranks, the CLI's default ``mlp``, AdamW, zb-v), measured
side by side in one run; medians over a few repetitions.

    PYTHONPATH=src python benchmarks/checkpoint.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from time import perf_counter

import torch

import pipesched
from pipesched.runtime.checkpoints import checkpoint_files
from pipesched.runtime.executor import PipelineRuntime, RuntimeOptions
from pipesched.runtime.stages.staged_model import StagedModel
from pipesched.runtime.launching.launch import spawn
from pipesched.training.models import get_model
from pipesched.training.train import make_optimizer

BATCH, MICROBATCHES, REPEATS = 64, 8, 5


def _measure(rank: int, world: int, job: tuple) -> dict:
    directory, name = job
    md = get_model("mlp")
    schedule = pipesched.build_schedule(name, world, MICROBATCHES)
    x, y = md.batch(0, BATCH, 0)
    rt = PipelineRuntime(StagedModel(md.build_block, md.num_blocks, x[: BATCH // MICROBATCHES]),
                         schedule, md.loss_fn, make_optimizer("adamw", 1e-3),
                         options=RuntimeOptions(timeout_s=120))
    steps, saves, loads, guards, starts, verifies = [], [], [], [], [], []
    for i in range(REPEATS):
        batch = md.batch(i, BATCH, 0)
        steps.append(rt.step(*batch).step_time)
        torch.distributed.barrier()
        t0 = perf_counter()
        rt._check_weights()
        guards.append(perf_counter() - t0)
        torch.distributed.barrier()
        t0 = perf_counter()
        rt.checks.before_step(*batch, None, i)
        starts.append(perf_counter() - t0)
        t0 = perf_counter()
        path = rt.save_checkpoint(directory)
        saves.append(perf_counter() - t0)
        t0 = perf_counter()
        rt.load_checkpoint(path)
        torch.distributed.barrier()
        loads.append(perf_counter() - t0)
        t0 = perf_counter()
        assert checkpoint_files.check_step(path) is None
        verifies.append(perf_counter() - t0)
    size = sum(f.stat().st_size for f in path.iterdir())
    return {"step": statistics.median(steps[1:]), "save": statistics.median(saves[1:]),
            "load": statistics.median(loads[1:]), "guard": statistics.median(guards[1:]),
            "start": statistics.median(starts[1:]), "verify": statistics.median(verifies[1:]), "bytes": size}


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "zb-v"
    with tempfile.TemporaryDirectory() as directory:
        r = spawn(_measure, 2, (directory, name), timeout_s=300)[0]
    print(f"{name}, 2 ranks, mlp (4.2M parameters), AdamW: checkpoint {r['bytes'] / 2**20:.1f} MiB")
    print(f"step {1000 * r['step']:.1f} ms   save {1000 * r['save']:.1f} ms ({r['save'] / r['step']:.2f} steps)   "
          f"load {1000 * r['load']:.1f} ms ({r['load'] / r['step']:.2f} steps)   "
          f"weight guard {1000 * r['guard']:.2f} ms ({100 * r['guard'] / r['step']:.1f}% of a step)   "
          f"step-start agreement {1000 * r['start']:.2f} ms ({100 * r['start'] / r['step']:.1f}% of a step)   "
          f"verify {1000 * r['verify']:.1f} ms ({r['bytes'] / 2**20 / r['verify']:.0f} MiB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
