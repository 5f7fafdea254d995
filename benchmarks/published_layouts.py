"""The advisor on published runs (pipesched/advise/published.py): each published layout and
setting priced, its predicted tokens/s per GPU beside the published figure, and the search's pick.

    PYTHONPATH=src python benchmarks/published_layouts.py table [NAME ...]      # docs/layouts.md's table
    PYTHONPATH=src python benchmarks/published_layouts.py calibrate RUN PEAK    # the TFLOP/s that RUN's figure gives
    PYTHONPATH=src python benchmarks/published_layouts.py search [NAME ...]     # the whole search's pick
    PYTHONPATH=src python benchmarks/published_layouts.py bubbles [NAME ...]    # each setting's bubble, both parts

``table`` prices each run's published settings (:func:`pipesched.advise.layout_search.evaluate_setting`)
at the stated TFLOP/s of its GPU kind; ``calibrate`` finds, by bisection, the TFLOP/s per GPU at
which RUN's predicted tokens/s per GPU equals its published figure (the one named run a GPU
kind's share of peak is calibrated on); ``search`` runs the whole layout search for each run
(slow for the large ones: benchmarks/advise_scale.py times them). Nothing is fitted per run.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from pipesched.advise.layout_search import advise_whole_layouts, evaluate_setting
from pipesched.advise.published import RUNS, PublishedRun


def priced(run: PublishedRun) -> list[tuple[str, float, float, bool]]:
    """Each published setting: (schedule, tokens/s per GPU predicted, GiB on the fullest rank, fits)."""
    out = []
    for schedule, chunks, microbatches in run.settings:
        row, fits = evaluate_setting(run.gpus, run.model(), run.global_batch, run.fabric(), run.layout, schedule,
                                     chunks, microbatches, run.recompute, sequence_parallel=run.sequence_parallel,
                                     ep=run.ep, precision=run.precision)
        tokens = run.global_batch * run.seq_len / (row.step_time / 1e3) / run.gpus
        out.append((schedule, tokens, row.candidate.peak_memory_bytes / 2 ** 30, fits))
    return out


def compared(run: PublishedRun) -> tuple[str, float, float, bool]:
    """The priced setting the published figure is of (the faster one where the paper does not say)."""
    rows = priced(run)
    mine = [r for r in rows if r[0] == run.measured_schedule] or [max(rows, key=lambda r: r[1])]
    return mine[0]


def table(names: list[str]) -> None:
    print("| run | GPUs | layout | setting | published tokens/s/GPU | predicted | predicted / published | GiB | fits |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run in RUNS:
        if names and run.name not in names:
            continue
        schedule, tokens, gib, fits = compared(run)
        layout = run.layout
        print(f"| {run.name} | {run.gpus} | pp {layout.pp} x dp {layout.dp_replicate} x dp_shard {layout.dp_shard} x "
              f"tp {layout.tp} | {schedule}, m={run.global_batch // layout.dp // run.microbatch_size} of "
              f"{run.microbatch_size} | {run.tokens_per_gpu:.4g} | {tokens:.4g} | {tokens / run.tokens_per_gpu:.3f} | "
              f"{gib:.1f} | {fits} |")


def calibrate(name: str, peak: float) -> None:
    run = next(r for r in RUNS if r.name == name)
    lo, hi = 0.05 * peak, peak
    for _ in range(20):
        mid = (lo + hi) / 2
        _, tokens, _, _ = compared(replace(run, tflops=mid))
        lo, hi = (mid, hi) if tokens < run.tokens_per_gpu else (lo, mid)
    print(f"{name}: {hi:.1f} TFLOP/s per GPU gives its published {run.tokens_per_gpu:.4g} tokens/s per GPU "
          f"({hi / peak:.3f} of {peak:g})")


def bubbles(names: list[str]) -> None:
    """Each published setting's bubble: all idle (``bubble_ratio``) and the busiest rank's alone
    (``pipeline_bubble``, Megatron-LM's (p-1)/(v m) where the stages are even)."""
    for run in RUNS:
        if names and run.name not in names:
            continue
        for schedule, chunks, microbatches in run.settings:
            row, _ = evaluate_setting(run.gpus, run.model(), run.global_batch, run.fabric(), run.layout, schedule,
                                      chunks, microbatches, run.recompute, sequence_parallel=run.sequence_parallel,
                                      ep=run.ep, precision=run.precision)
            print(f"{run.name} {schedule} v={chunks} m={microbatches}: bubble {100 * row.candidate.bubble_ratio:.1f}%, "
                  f"the busiest rank's {100 * row.pipeline_bubble:.1f}%, p2p {row.candidate.costs.comm:.3g} ms")


def search(names: list[str]) -> None:
    for run in RUNS:
        if names and run.name not in names:
            continue
        started = time.process_time()
        advice = advise_whole_layouts(run.gpus, run.model(), run.global_batch, run.fabric(),
                                      sequence_parallel=run.sequence_parallel, ep=run.ep, precision=run.precision)
        best = advice.recommended
        print(f"{run.name}: {time.process_time() - started:.1f} CPU s; pick {best.label()} "
              f"step {best.step_time / 1e3:.2f} s")


if __name__ == "__main__":
    mode, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("table", [])
    if mode == "calibrate":
        calibrate(args[0], float(args[1]))
    else:
        {"table": table, "search": search, "bubbles": bubbles}[mode](args)
