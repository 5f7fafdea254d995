"""Hugging Face benchmark: a Llama (width 256, 8 layers) under every schedule of pipesched.hf,
against the single-process model and torch.distributed.pipelining's manual stages on the same split.

Two ranks (gloo, one thread each); the same blocks (pipesched.hf's, built from the config, block
``i`` seeded ``seed + i``), batches, balanced split and AdamW for every variant. Each variant runs
in the same processes, taking turns of a few steps, so that the shared machine's drift hits all
alike; medians of the slowest rank's step. The single-process model runs in this process, one
thread, the whole batch in one forward and backward.

    PYTHONPATH=src python benchmarks/hf.py [--rounds 6] [--burst 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from time import perf_counter

import torch
import torch.distributed as dist
from torch import nn

import pipesched
from pipesched.runtime.launching.launch import spawn
from pipesched.runtime.stages.copies import balanced_block_counts
from pipesched.runtime.stages.partition import build_block_seeded, stage_block_ranges
from pipesched.training.models import get_model

SCHEDULES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "interleaved-zb", "v-half", "dualpipev", "dualpipe"]
TORCH = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved-1f1b": "ScheduleInterleaved1F1B",
         "zb-v": "ScheduleZBVZeroBubble", "interleaved-zb": "ScheduleInterleavedZeroBubble"}
BATCH, SEQ, MICROBATCHES, SEED, LR = 16, 64, 8, 0, 1e-3
CONFIG = dict(model_type="llama", vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=8,
              num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128, use_cache=False,
              attn_implementation="sdpa")


def adamw(params):
    return torch.optim.AdamW(params, lr=LR)


def _ours(md, config_path: str, schedule):
    from pipesched import hf

    config = hf.read_config(config_path)
    x, y = md.batch(0, BATCH, SEED)
    rt = hf.pipeline(config, schedule, optimizer=adamw, sample_batch={"input_ids": x, "labels": y}, seed=SEED)

    def step(x, y) -> float:
        return rt.step({"input_ids": x, "labels": y}).step_time

    return step


def _torch(md, name: str, schedule, rank: int):
    """torch's schedule class on manual PipelineStages of the same blocks and split."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as ts

    ranges = stage_block_ranges(md.num_blocks, schedule.stages, balanced_block_counts(md.block_costs, schedule))
    owned = [s for s, r in enumerate(schedule.placement) if r == rank]
    mods = {s: nn.Sequential(*(build_block_seeded(md.build_block, i, SEED) for i in ranges[s])) for s in owned}
    stages = [PipelineStage(mods[s], s, schedule.stages, torch.device("cpu")) for s in owned]
    cls = getattr(ts, name)
    single = issubclass(cls, ts.PipelineScheduleSingle)
    sched = cls(stages[0] if single else stages, n_microbatches=MICROBATCHES, loss_fn=md.loss_fn)
    opt = adamw([p for m in mods.values() for p in m.parameters()])
    first, last = 0 in owned, schedule.stages - 1 in owned

    def step(x, y) -> float:
        dist.barrier()
        t0 = perf_counter()
        kwargs = dict(target=y, losses=[]) if last else {}
        sched.step(*((x,) if first else ()), return_outputs=False, **kwargs)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return perf_counter() - t0

    return step


def bench_worker(rank: int, world: int, job: tuple) -> dict:
    config_path, rounds, burst = job
    md = get_model(f"hf:{config_path}", context=SEQ)
    runners = {}
    for name in SCHEDULES:
        schedule = pipesched.build_schedule(name, world, MICROBATCHES)
        runners[name] = _ours(md, config_path, schedule)
        if name in TORCH:
            runners[f"torch {name}"] = _torch(md, TORCH[name], schedule, rank)
    batches = [md.batch(i, BATCH, SEED) for i in range(4)]
    times = {label: [] for label in runners}
    for run in runners.values():  # warm-up (torch infers shapes on its first step)
        run(*batches[0])
    for i in range(rounds):
        for label, run in runners.items():
            for j in range(burst + 1):  # the first of a burst warms the caches up, unrecorded
                t = run(*batches[(i + j) % len(batches)])
                if j:
                    times[label].append(t)
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(times, gathered, dst=0)
    if rank != 0:
        return {}
    return {k: [max(g[k][i] for g in gathered) for i in range(len(times[k]))] for k in times}


def single_process(config_path: str, steps: int) -> list[float]:
    torch.set_num_threads(1)
    md = get_model(f"hf:{config_path}", context=SEQ)
    model = md.sequential(SEED)
    opt = adamw(list(model.parameters()))
    times = []
    for i in range(steps + 1):
        x, y = md.batch(i % 4, BATCH, SEED)
        t0 = perf_counter()
        opt.zero_grad(set_to_none=True)
        md.loss_fn(model(x), y).backward()
        opt.step()
        times.append(perf_counter() - t0)
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--burst", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    config_path = folder / "llama.json"
    config_path.write_text(json.dumps(CONFIG))
    alone = statistics.median(single_process(str(config_path), args.rounds * args.burst))
    res = spawn(bench_worker, 2, (str(config_path), args.rounds, args.burst), timeout_s=600)[0]
    rows = []
    print(f"Llama width 256, 8 layers, batch {BATCH}x{SEQ}, m={MICROBATCHES}, 2 ranks (gloo, 1 thread each); "
          f"single process (1 thread): {1000 * alone:.1f} ms")
    print(f"{'schedule':18} {'ours ms':>8} {'/single':>8} {'torch ms':>9} {'ours/torch':>10}")
    for name in SCHEDULES:
        ours = statistics.median(res[name])
        theirs = statistics.median(res[f"torch {name}"]) if name in TORCH else None
        rows.append({"schedule": name, "ours_ms": 1000 * ours, "single_ms": 1000 * alone,
                     "torch_ms": None if theirs is None else 1000 * theirs})
        torch_cols = f"{1000 * theirs:9.1f} {ours / theirs:10.2f}" if theirs else f"{'-':>9} {'-':>10}"
        print(f"{name:18} {1000 * ours:8.1f} {ours / alone:8.2f} {torch_cols}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
