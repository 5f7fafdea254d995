"""The complete whole-layout search at the sizes people rent: its CPU time against the candidates
it prices, and how it grows with the GPUs.

Cases (inputs in pipesched/advise/published.py):

- ``1t-fixed``: Megatron-LM's 1T row with its published layout fixed (TP 8 x PP 64 x DP 6), the
  one layout searched in full (every family, chunk count and recomputation choice at 512
  microbatches of 1);
- ``1t``: the same model, every layout of its 3,072 A100;
- ``405b-N``: Llama 3 405B (sequence 8192, batch 2,048 sequences, microbatches of 1) on N H100,
  every layout, N = 2,048 ... 16,384.

    PYTHONPATH=src python benchmarks/advise_scale.py [CASE ...]

For each case: CPU seconds (``time.process_time``, one process) and wall seconds, candidates simulated and priced
(each for every layout of its group), layouts searched, layouts named not searched (their full
search predicted above a minute), the pick, and where the published layout stands.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from pipesched.advise.layout_search import advise_whole_layouts
from pipesched.advise.published import LLAMA3_405B, MEGATRON_1T, PublishedRun


def _405b_on(gpus: int) -> PublishedRun:
    """Llama 3 405B's run on ``gpus`` GPUs: the batch, microbatches of 1 and the layout's other
    sizes as published (its replicas' microbatches follow)."""
    shards = gpus // 128
    microbatches = LLAMA3_405B.global_batch // shards
    return replace(LLAMA3_405B, gpus=gpus, layout=replace(LLAMA3_405B.layout, dp_shard=shards),
                   settings=tuple((s, v, microbatches) for s, v, _ in LLAMA3_405B.settings))


CASES = {
    "1t-fixed": (MEGATRON_1T, {"pp": 64, "tp": 8, "dp_replicate": 6, "dp_shard": 1}),
    "1t": (MEGATRON_1T, {}),
    **{f"405b-{n}": (_405b_on(n), {}) for n in (2048, 4096, 8192, 16384)},
}


def run_case(name: str) -> None:
    run, fixed = CASES[name]
    started, wall = time.process_time(), time.perf_counter()
    advice = advise_whole_layouts(run.gpus, run.model(), run.global_batch, run.fabric(), fixed=fixed,
                                  sequence_parallel=run.sequence_parallel)
    seconds, wall = time.process_time() - started, time.perf_counter() - wall
    best = advice.recommended
    not_searched = sum("not searched" in line for line in advice.skipped)
    published = [r for r in advice.candidates if (r.pp, r.dp, r.dp_shard, r.tp) == (
        run.layout.pp, run.layout.dp_replicate, run.layout.dp_shard, run.layout.tp)]
    print(f"{name}: {run.gpus} GPUs, {seconds:.1f} CPU s ({wall:.1f} s wall), {advice.priced} candidates priced, "
          f"{len(advice.searched)} layouts searched, {not_searched} not searched, "
          f"{len(advice.skipped) - not_searched} left out otherwise")
    print(f"  pick: {best.label()} step {best.step_time / 1e3:.2f} s")
    if published:
        p = published[0]
        print(f"  published layout: {p.label()} step {p.step_time / 1e3:.2f} s, bubble {p.candidate.bubble_ratio:.3f}")
    else:
        print("  published layout: " + next((line for line in advice.skipped if line.startswith(
            f"pp {run.layout.pp} x dp {run.layout.dp_replicate} x dp_shard {run.layout.dp_shard} x tp {run.layout.tp}")),
            "not among the rows"))


if __name__ == "__main__":
    for case in sys.argv[1:] or list(CASES):
        run_case(case)
