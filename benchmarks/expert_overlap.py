"""DualPipe's overlap under expert parallelism: the exposed all-to-all time per step with an
``OVERLAP_F_B`` pair's halves interleaved at their exchanges, and with them run one after the
other (``RuntimeOptions.interleave_pairs``; runtime/engine/pair_turns.py).

One launch (dualpipev on ``--pp`` (2) pipeline x 2 data-parallel ranks, ``ep`` 2, gloo on CPU; at
``--pp 1`` both of the V's stages are on each rank, 2 ranks in all, nearly every action a pair), the
tests' tiny Mixtral (4 MoE layers) and DeepSeek-V3 (its first 3 layers dense, as the family's
``first_k_dense_replace`` says: one MoE layer, on the last stage) in float32, ``--microbatches``
(8) of a 16 x 16 batch, SGD, ``--steps`` steps (25). The two modes alternate step by step in one
run (interleaved on even steps, in turn on odd ones), so that a shared machine's load falls on
both alike; step 0 (it learns the stage sizes, its pairs in turn) is left out. For every rank and
every adjacent (interleaved, in turn) pair of steps: the exposed exchange seconds
(``StepResult.exposed_exchange_s``: the time the rank waited on its all-to-alls; time hidden
behind the other half's compute is not counted) and the rank's CPU seconds (its process's,
threads included), and rank 0's step time. Printed: the medians per mode, and the median over
step pairs of the ratio interleaved / in turn. tests/test_expert_overlap.py checks the two modes
bitwise alike.

Under torchrun on 4 GPUs (benchmarks/gpu_check.sh) each rank computes on its GPU and NCCL's
all-to-all runs on NCCL's own stream, the compute on the current one: the interleaving then
queues the other half's kernels before the wait. A wait on NCCL does not block the host, so there
the exposed seconds are ~0 by construction and the step time is the figure. Not run on a GPU yet.

    PYTHONPATH=src:tests python benchmarks/expert_overlap.py [--steps 25] [--microbatches 8] [--pp 2]
    PYTHONPATH=src:tests torchrun --standalone --nproc-per-node 4 benchmarks/expert_overlap.py
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from pipesched.runtime.launching.launch import run_torchrun, spawn, under_torchrun

MODELS = ("mixtral", "deepseek-v3")


def main() -> int:
    from expert_cases import overlap_runs
    from hf_cases import make_batch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--pp", type=int, default=2, help="pipeline ranks (1: dualpipev's V on one rank, 2 ranks in all)")
    args = parser.parse_args()
    batches = [make_batch(step, 16, 16) for step in range(args.steps)]
    runs = [(kind, kind, torch.float32, None, "alternate") for kind in MODELS]
    job = {"runs": runs, "batches": batches, "steps": args.steps, "microbatches": args.microbatches, "pp": args.pp}
    results = (run_torchrun(overlap_runs, job, 3000) if under_torchrun()
               else spawn(overlap_runs, 2 * args.pp, job, 3000)[0])
    if results is None:  # a torchrun rank other than 0
        return 0
    for kind in MODELS:
        got = results[kind]
        got["step"] = [got["step_times"]]  # rank 0's
        for what in ("exposed", "cpu", "step"):
            # per rank, steps 2, 4, ... interleaved and 1, 3, ... in turn: the pairs (2i + 2, 2i + 1)
            pairs = [(rank[s + 1], rank[s]) for rank in got[what] for s in range(1, args.steps - 1, 2)]
            inter, turn = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
            ratio = statistics.median(a / b for a, b in pairs)
            print(f"{kind:12} {what:8} per rank and step: interleaved {inter * 1e3:6.1f} ms, in turn "
                  f"{turn * 1e3:6.1f} ms; interleaved / in turn, median of {len(pairs)} step pairs: {ratio:.2f}")
        print(f"{kind:12} hand-overs {got['handed']} (rank 0, all steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
