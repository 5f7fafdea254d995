"""Expert parallelism inside stages: every layout issue 40 asks to hold, against one process.

One 4-rank launch (2 pipeline ranks x 2 data-parallel ranks, gloo on CPU), float64 throughout,
SGD, three steps on the tests' batches (8 x 16), through ``tests/expert_cases.expert_runs``:

- Mixtral under 1f1b and dualpipev with ``dp 2, ep 2``, under zb-v with ``dp_shard 2, ep 2``;
- Qwen3-MoE and DeepSeek-V3 under a loop (1f1b, interleaved-zb) and a V (zb-v, dualpipev) with ``ep 2``;
- Mixtral under 1f1b with ``dp 2`` and no ``ep``: the bytes the experts' split saves.

Prints, per run, the largest relative error of the losses, first gradients and final weights
against the model in one process (bound 1e-10: float64 with sums in other orders,
tests/test_expert_parallel.py), each rank's measured and predicted parameter bytes, and the
median step time; exits 1 if an error is over the bound or a measurement differs from its
prediction. tests/test_expert_parallel.py runs three of these layouts.

    PYTHONPATH=src:tests python benchmarks/expert_parallel.py
"""

from __future__ import annotations

import statistics
import sys

import torch

import pipesched
from pipesched.runtime.launching.launch import spawn

BOUND = 1e-10
LAYOUTS = [("mixtral", "1f1b", {"dp": 2, "ep": 2}), ("mixtral", "dualpipev", {"dp": 2, "ep": 2}),
           ("mixtral", "zb-v", {"dp_shard": 2, "ep": 2}), ("mixtral", "1f1b", {"dp": 2}),
           ("qwen3-moe", "1f1b", {"dp": 2, "ep": 2}), ("qwen3-moe", "zb-v", {"dp": 2, "ep": 2}),
           ("deepseek-v3", "interleaved-zb", {"dp": 2, "ep": 2}), ("deepseek-v3", "dualpipev", {"dp": 2, "ep": 2})]


def main() -> int:
    from expert_cases import expert_runs
    from hf_cases import make_batch, make_model, reference
    from runtime_cases import relative_error

    batches = [make_batch(step, 8, 16) for step in range(3)]
    runs = [(f"{kind} {name} " + " ".join(f"{k}{v}" for k, v in sizes.items()), kind,
             pipesched.build_schedule(name, 2, 4), sizes) for kind, name, sizes in LAYOUTS]
    results = spawn(expert_runs, 4, {"runs": runs, "batches": batches}, timeout_s=900)[0]
    failed = False
    for label, got in results.items():
        want = reference(make_model(label.split()[0], torch.float64), batches, optimizer="sgd")
        error = max(max(abs(a - b) / abs(b) for a, b in zip(got["losses"], want["losses"])),
                    relative_error(got["grads"], want["grads"]), relative_error(got["params"], want["params"]))
        exact = all(rank["measured"] == rank["predicted"] for rank in got["bytes"])
        params = [rank["measured"]["params"] for rank in got["bytes"]]
        failed |= error > BOUND or not exact
        print(f"{label:36} error {error:.1e}  params per rank {params} (= predicted: {exact})  "
              f"median step {statistics.median(got['step_times']) * 1e3:.0f} ms")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
