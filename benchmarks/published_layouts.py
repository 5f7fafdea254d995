"""The advisor on published runs: torchtitan's Llama 3.1 405B and 70B, three Megatron-LM rows.

For each run: the published layout and setting priced by the advisor's model
(:func:`pipesched.advise.layout_search.evaluate_setting`), whether it fits that model's memory,
and the whole search's pick (:func:`~pipesched.advise.layout_search.advise_whole_layouts`) with
its predicted step, so that the pick is either the published layout or one predicted at least
as fast. Inputs are stated here and in docs/layouts.md, never fitted to the published figures.

    PYTHONPATH=src python benchmarks/published_layouts.py [NAME ...]
"""

from __future__ import annotations

import sys
import time

from pipesched.advise.layout_search import advise_whole_layouts, evaluate_setting
from pipesched.advise.published import RUNS


def main(names: list[str]) -> None:
    for run in RUNS:
        if names and run.name not in names:
            continue
        model, fabric = run.model(), run.fabric()
        started = time.process_time()
        advice = advise_whole_layouts(run.gpus, model, run.global_batch, fabric, sequence_parallel=run.sequence_parallel)
        seconds = time.process_time() - started
        best = advice.recommended
        print(f"{run.name} (published: {run.published})")
        print(f"  search {seconds:.1f} CPU s, {len(advice.searched)} layouts searched, "
              f"{len(advice.skipped)} left out (named)")
        print(f"  pick: {best.label()} step {best.step_time / 1e3:.2f} s, {best.candidate.memory_gb:.1f} GB")
        for schedule, chunks, microbatches in run.settings:
            priced, fits = evaluate_setting(run.gpus, model, run.global_batch, fabric, run.layout, schedule, chunks,
                                            microbatches, run.recompute, sequence_parallel=run.sequence_parallel)
            print(f"  published {priced.label()}: step {priced.step_time / 1e3:.2f} s, "
                  f"{priced.candidate.peak_memory_bytes / 2**30:.1f} GiB, fits: {fits}; "
                  f"pick/published step {best.step_time / priced.step_time:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
