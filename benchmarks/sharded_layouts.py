"""Eight-process sharded layouts: HSDP (pp 2 x dp_replicate 2 x dp_shard 2) and FSDP2 with tensor
parallelism (pp 2 x dp_shard 2 x tp 2), every schedule the issue names, against the unpipelined model.

Run: PYTHONPATH=src python benchmarks/sharded_layouts.py [--check] [--layouts ...] [--schedules ...] [--models ...]
     torchrun --nproc-per-node 8 benchmarks/sharded_layouts.py --check          (NCCL, one GPU per rank)

One launch per layout runs every (model, schedule) of it: the built-in gpt through
``PipelineRuntime``, a Hugging Face Llama and GPT-2 (its head tied to its token embedding) through
``pipesched.hf.pipeline``, fp32, SGD, on the same batches as the model in one process
(tests/sharded_pipeline_cases.py's workers). dualpipe holds two model copies per rank pair; the V
schedules (zb-v, dualpipev) put GPT-2's embedding and head, one tied weight, on two stages of
rank 0 (dualpipe: each rank holds one copy's embedding and the other's head), each stage its own
sharded copy (src/pipesched/runtime/comm/tied_copies.py). The table
gives each run's first loss, first-step gradients and final weights as the largest error relative
to the reference's largest entry, and (gpt) whether every rank's parameter, gradient and optimizer
bytes equal the prediction, and (gpt under 1f1b, zb-v and dualpipe) how far the held-out loss
evaluated after the first step is from the one-process model's on the same weights and batches.
``--check`` fails on any error of 1e-5 or more (1e-6 for the held-out loss): what differs is the
order of fp32 sums (microbatches, shards, replicas, the row-parallel all-reduce), a few ulps on
sums of at most a few hundred terms. tests/test_sharded_pipelines.py runs one 8-process launch of
the same workers (zb-v under HSDP, dualpipe under FSDP x TP, gradients clipped).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from time import perf_counter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import pipesched  # noqa: E402
from pipesched.runtime.launching.launch import (  # noqa: E402
    rank_device,
    run_torchrun,
    spawn,
    under_torchrun,
)

WORLD = 8
LAYOUTS = {"hsdp": (2, 2, 1), "fsdp x tp": (1, 2, 2)}  # (dp_replicate, dp_shard, tp) at pp 2
SCHEDULES = ("1f1b", "zb-v", "interleaved-zb", "dualpipev", "dualpipe")
MODELS = ("gpt", "llama", "gpt2")
GPT_SIZE = dict(layers=2, dim=16, heads=4, context=8)  # 4 blocks: one per stage at 2 ranks x 2 chunks
GPT_BATCH, GPT_MICROBATCHES = 16, 4  # 4 data-parallel ranks x 4 microbatches of one sample
HF_BATCH, HF_MICROBATCHES, HF_STEPS, HF_SEQ = 8, 2, 2, 16
TOL = 1e-5
EVAL_TOL = 1e-6  # the gpt's held-out loss (1f1b, zb-v, dualpipe; issue 32's bound): absolute, of a loss near 3.6


def runs_of(layouts, schedules, models) -> tuple[list, list]:
    """(gpt runs, Hugging Face runs) as tests/sharded_pipeline_cases.py's workers take them."""
    gpt = [(f"gpt {name} {where}", pipesched.build_schedule(name, 2, GPT_MICROBATCHES), LAYOUTS[where])
           for where in layouts for name in schedules if "gpt" in models]
    hf = [(f"{kind} {name} {where}", kind, pipesched.build_schedule(name, 2, HF_MICROBATCHES), LAYOUTS[where])
          for where in layouts for kind in ("llama", "gpt2") if kind in models for name in schedules]
    return gpt, hf


def hf_batches() -> list:
    from hf_cases import make_batch

    return [make_batch(step, HF_BATCH, HF_SEQ) for step in range(HF_STEPS)]


def layout_worker(rank: int, world: int, job: tuple) -> dict:
    """Every run of ``job`` (gpt runs, Hugging Face runs) on this launch; rank 0 returns the results."""
    from sharded_pipeline_cases import hf_pipelined_layouts, pipelined_layouts

    gpt, hf = job
    device = str(rank_device())
    out = {}
    if gpt:
        out.update(pipelined_layouts(rank, world, (GPT_SIZE, GPT_BATCH, gpt, device)) or {})
    if hf:
        out.update(hf_pipelined_layouts(rank, world, (hf, hf_batches(), device)) or {})
    return out if rank == 0 else None


def errors(results: dict) -> dict:
    """Per run: (loss, gradient, weight) relative errors against its model's reference, and
    whether every rank's bytes equal the prediction (None where not measured)."""
    from runtime_cases import reference, relative_error
    from sharded_pipeline_cases import STEPS, held_out_error
    from test_sharded_pipelines import _hf_reference

    refs: dict = {}
    out = {}
    for label, got in results.items():
        kind = label.split()[0]
        if kind not in refs:
            refs[kind] = (reference("gpt", GPT_SIZE, GPT_BATCH, steps=STEPS) if kind == "gpt" else _hf_reference(kind, hf_batches()))
        want = refs[kind]
        states = got.get("state_bytes")
        out[label] = (abs(got["losses"][0] - want["loss"]) / abs(want["loss"]), relative_error(got["grads"], want["grads"]),
                      relative_error(got["params"], want["params"]),
                      None if states is None else all(r["measured"] == r["predicted"] for r in states),
                      held_out_error(GPT_SIZE, got["eval"]) if "eval" in got else None)
    return out


def table(errs: dict, walls: dict) -> list[str]:
    lines = ["| run (model, schedule, layout) | loss | gradients | weights | bytes = predicted | held-out loss |",
             "|---|---|---|---|---|---|"]
    failed = False
    for label, (loss, grads, params, fits, held_out) in errs.items():
        failed |= max(loss, grads, params) >= TOL or fits is False or (held_out or 0) > EVAL_TOL
        lines.append(f"| {label} | {loss:.1e} | {grads:.1e} | {params:.1e} | {'-' if fits is None else fits} | "
                     f"{'-' if held_out is None else f'{held_out:.1e}'} |")
    lines += ["", "launch wall time: " + ", ".join(f"{where} {s:.0f} s" for where, s in walls.items())]
    if failed:
        lines.append(f"FAILED: an error of {TOL} or more, bytes other than predicted, or a held-out loss more than {EVAL_TOL} "
                     "from the one-process model's")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help=f"exit 1 unless every error is under {TOL}")
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES))
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    args = parser.parse_args()
    results, walls = {}, {}
    for where in args.layouts:
        job = runs_of([where], args.schedules, args.models)
        t0 = perf_counter()
        if under_torchrun():
            got = run_torchrun(layout_worker, job, 1200)
            if int(os.environ["RANK"]) != 0:
                continue
        else:
            got = spawn(layout_worker, WORLD, job, timeout_s=1200)[0]
        walls[where] = perf_counter() - t0
        results.update(got)
    if results:
        lines = table(errors(results), walls)
        print("\n".join(lines) + "\n", flush=True)
        if args.check and lines[-1].startswith("FAILED"):
            raise SystemExit(1)


if __name__ == "__main__":
    main()
