"""The complete whole-layout search at the sizes people rent: its CPU time against the candidates
it prices, and how it grows with the GPUs.

Cases (inputs in pipesched/advise/published.py):

- ``1t-fixed``: Megatron-LM's 1T row with its published layout fixed (TP 8 x PP 64 x DP 6), the
  one layout searched in full (every family, chunk count and recomputation choice at 512
  microbatches of 1);
- ``1t``: the same model, every layout of its 3,072 A100;
- ``405b-N``: Llama 3 405B (sequence 8192, batch 2,048 sequences, microbatches of 1) on N H100,
  every layout, N = 2,048 ... 16,384;
- ``deepseek-ep``: DeepSeek-V3 with its published PP 16 x 128 ZeRO-1 ranks fixed and EP left
  open (every size dividing the 256 experts and the 128 ranks);
- ``small``: an 8-layer model on 16 GPUs, every layout (the case tests/test_advise_whole_search.py runs).

    PYTHONPATH=src python benchmarks/advise_scale.py [--workers N] [CASE ...]

``--workers``: the search's processes (default: advise/parallel.py's, two on two cores for a large group).
For each case: CPU seconds (this process's and its workers', ``resource.getrusage``) and wall seconds,
candidates simulated and priced
(each for every layout of its group), layouts searched, layouts proven unable to beat the pick
(advise/layout_bound.py), layouts left out otherwise (refused, or nothing fits), the pick, and
where the published layout stands. A progress line on stderr every 30 s.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass, replace
from typing import Optional

from pipesched.advise.layout import LayoutCandidate
from pipesched.advise.layout_search import advise_whole_layouts
from pipesched.advise.published import DEEPSEEK_V3, LLAMA3_405B, MEGATRON_1T, PublishedRun
from pipesched.cli.progress import LayoutProgress
from pipesched.parallel_layout import ParallelLayout


def _405b_on(gpus: int) -> PublishedRun:
    """Llama 3 405B's run on ``gpus`` GPUs: the batch, microbatches of 1 and the layout's other
    sizes as published (its replicas' microbatches follow)."""
    shards = gpus // 128
    microbatches = LLAMA3_405B.global_batch // shards
    return replace(LLAMA3_405B, gpus=gpus, layout=replace(LLAMA3_405B.layout, dp_shard=shards),
                   settings=tuple((s, v, microbatches) for s, v, _ in LLAMA3_405B.settings))


SMALL = replace(MEGATRON_1T, name="small", layers=8, hidden=1024, heads=16, vocab=32000, seq_len=512, gpus=16,
                global_batch=64, layout=ParallelLayout(4, 1, 4, 1), settings=(("1f1b", 1, 8),), gpus_per_node=4)

CASES = {
    "1t-fixed": (MEGATRON_1T, {"pp": 64, "tp": 8, "dp_replicate": 6, "dp_shard": 1}),
    "1t": (MEGATRON_1T, {}),
    **{f"405b-{n}": (_405b_on(n), {}) for n in (2048, 4096, 8192, 16384)},
    "deepseek-ep": (DEEPSEEK_V3, {"pp": 16, "tp": 1, "dp_replicate": 1, "dp_shard": 128}),
    "small": (SMALL, {}),
}
SLOWER = "cannot beat the pick"


@dataclass(frozen=True)
class Outcome:
    """One case's search: its cost, its verdicts, the pick and the published layout's best row."""

    cpu_seconds: float
    wall_seconds: float
    priced: int  # candidates simulated, each priced for every layout of its group
    searched: int  # layouts with rows
    slower: int  # layouts proven unable to beat the pick
    left_out: int  # refused, or nothing fits
    pick: LayoutCandidate
    published: Optional[LayoutCandidate]
    published_verdict: str  # why the published layout has no row ("" when it has)


def _cpu() -> float:
    """User and system CPU of this process and of its finished workers (the search's pools)."""
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def run_case(name: str, workers: Optional[int] = None) -> Outcome:
    run, fixed = CASES[name]
    started, wall = _cpu(), time.perf_counter()
    advice = advise_whole_layouts(run.gpus, run.model(), run.global_batch, run.fabric(), fixed=fixed,
                                  sequence_parallel=run.sequence_parallel, precision=run.precision,
                                  layouts_done=LayoutProgress(), workers=workers)
    seconds, wall = _cpu() - started, time.perf_counter() - wall
    slower = sum(SLOWER in line for line in advice.skipped)
    mine = (run.layout.pp, run.layout.dp_replicate, run.layout.dp_shard, run.layout.tp)
    published = [r for r in advice.candidates if (r.pp, r.dp, r.dp_shard, r.tp, r.ep) == (*mine, run.ep)]
    name_of = f"pp {mine[0]} x dp {mine[1]} x dp_shard {mine[2]} x tp {mine[3]}" + (f" x ep {run.ep}" if run.ep > 1 else "")
    verdict = "" if published else next((line for line in advice.skipped if line.startswith(name_of)), "no verdict")
    return Outcome(seconds, wall, advice.priced, len(advice.searched), slower, len(advice.skipped) - slower,
                   advice.recommended, published[0] if published else None, verdict)


def report(name: str, out: Outcome) -> None:
    run = CASES[name][0]
    print(f"{name}: {run.gpus} GPUs, {out.cpu_seconds:.1f} CPU s ({out.wall_seconds:.1f} s wall), {out.priced} "
          f"candidates priced, {out.searched} layouts searched, {out.slower} proven slower, {out.left_out} left out "
          "otherwise")
    print(f"  pick: {out.pick.label()} step {out.pick.step_time / 1e3:.2f} s")
    p = out.published
    print(f"  published layout: {p.label()} step {p.step_time / 1e3:.2f} s, bubble {p.candidate.bubble_ratio:.3f}"
          if p else f"  published layout: {out.published_verdict}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    processes = int(args.pop(args.index("--workers") + 1)) if "--workers" in args else None
    args = [a for a in args if a != "--workers"]
    for case in args or list(CASES):
        report(case, run_case(case, processes))
