"""Expert parallelism inside stages: every layout issue 40 asks to hold, against one process.

Two launches (gloo on CPU), float64 throughout, SGD, three steps on the tests' batches (8 x 16),
through ``tests/expert_cases.expert_runs``. Four ranks (2 pipeline ranks x 2 data-parallel):

- Mixtral under 1f1b and dualpipev with ``dp 2, ep 2``, under zb-v with ``dp_shard 2, ep 2``;
- Qwen3-MoE and DeepSeek-V3 under a loop (1f1b, interleaved-zb) and a V (zb-v, dualpipev) with ``ep 2``;
- Mixtral under 1f1b with ``dp 2`` and no ``ep``: the bytes the experts' split saves.

Eight ranks (``--all``, docs/expert-parallel.md), expert sharding and tensor parallelism:

- Qwen3-MoE under 1f1b with ``dp_shard 2, tp 2, ep 2`` and DeepSeek-V3 under zb-v with
  ``dp 2, tp 2, ep 2`` (2 pipeline ranks);
- Mixtral under 1f1b with ``dp_shard 4, ep 2`` (2 pipeline ranks: each EP rank's experts
  FSDP-sharded over two ranks) and under interleaved-1f1b with ``dp_shard 4, tp 2, ep 2`` (one
  pipeline rank, its two looped stages: sharded experts beside tensor parallelism), and under
  zb-v with ``dp 2, dp_shard 4, ep 2`` (one pipeline rank: the experts' HSDP, two shards x two
  replicas).

Prints, per run, the largest relative error of the losses, first gradients and final weights
against the model in one process (bound 1e-10: float64 with sums in other orders,
tests/test_expert_parallel.py), each rank's measured and predicted parameter bytes, and the
median step time; exits 1 if an error is over the bound or a measurement differs from its
prediction. tests/test_expert_parallel.py and tests/test_expert_sharding.py run five of these
layouts (the latter at pipeline 1 on four ranks).

With ``--checkpoints``, checkpoints across EP degrees instead (``tests/expert_checkpoint_cases``):
Mixtral, Qwen3-MoE and DeepSeek-V3, each in one 4-rank launch, float64 throughout, AdamW, saved
after step 1 at pp 2 x dp 2 x ep 2 and resumed for step 2 at the layouts of :data:`RESUMED` (each
loading the checkpoint it names: ep 2 -> ep 1 -> pp 4 -> back to ep 2 under FSDP, ep 4, and the
experts FSDP-sharded at dp_shard 4 x ep 2, whose checkpoint ep 1, dp_shard 2 x ep 2 and dp_shard 2 x
tp 2 x ep 2 resume); then Mixtral in one 8-rank launch saved under the experts' HSDP (dp 2 x
dp_shard 4 x ep 2, :data:`RESUMED_8`), and in one 6-rank launch at dp_shard 6 x ep 2, whose 3 shards
of an EP rank's 2 experts are uneven (:data:`RESUMED_6`). Prints, per resumed run, whether the
checkpoint it saved again at once holds every entry of the one it loaded bit for bit (weights,
AdamW's moments: the state moved exactly), and the relative error of its step-2 loss and weights
against the uninterrupted run (at the same layout: against the run it resumes, bound 0; 1e-10
elsewhere: float64, sums in other orders, tests/test_expert_checkpoints.py); exits 1 on a difference
or an error over the bound. tests/test_expert_checkpoints.py runs Mixtral's first three layouts and
two sharded ones.

    PYTHONPATH=src:tests python benchmarks/expert_parallel.py [--all | --checkpoints]
"""

from __future__ import annotations

import statistics
import sys
import tempfile

import torch

import pipesched

BOUND = 1e-10
LAYOUTS = {  # ranks -> (model, schedule, pipeline ranks, microbatches, layout sizes)
    4: [("mixtral", "1f1b", 2, 4, {"dp": 2, "ep": 2}), ("mixtral", "dualpipev", 2, 4, {"dp": 2, "ep": 2}),
        ("mixtral", "zb-v", 2, 4, {"dp_shard": 2, "ep": 2}), ("mixtral", "1f1b", 2, 4, {"dp": 2}),
        ("qwen3-moe", "1f1b", 2, 4, {"dp": 2, "ep": 2}), ("qwen3-moe", "zb-v", 2, 4, {"dp": 2, "ep": 2}),
        ("deepseek-v3", "interleaved-zb", 2, 4, {"dp": 2, "ep": 2}),
        ("deepseek-v3", "dualpipev", 2, 4, {"dp": 2, "ep": 2})],
    8: [("qwen3-moe", "1f1b", 2, 4, {"dp_shard": 2, "tp": 2, "ep": 2}),
        ("deepseek-v3", "zb-v", 2, 4, {"dp": 2, "tp": 2, "ep": 2}),
        ("mixtral", "1f1b", 2, 2, {"dp_shard": 4, "ep": 2}),
        ("mixtral", "interleaved-1f1b", 1, 2, {"dp_shard": 4, "tp": 2, "ep": 2}),
        ("mixtral", "zb-v", 1, 1, {"dp": 2, "dp_shard": 4, "ep": 2})],
}

RESUMED = {  # label -> (pp, sizes, the checkpoint it loads); saved at pp 2 x dp 2 x ep 2
    "pp 2 dp 2 ep 2 (same)": (2, {"dp": 2, "ep": 2}, "uninterrupted"),
    "pp 2 dp 2 (ep 1)": (2, {"dp": 2}, "uninterrupted"),
    "pp 1 dp 4 ep 4": (1, {"dp": 4, "ep": 4, "m": 2}, "uninterrupted"),
    "pp 4 (from ep 1)": (4, {}, "pp 2 dp 2 (ep 1)"),
    "pp 2 dp_shard 2 ep 2 (from pp 4)": (2, {"dp_shard": 2, "ep": 2}, "pp 4 (from ep 1)"),
    "pp 1 dp 2 dp_shard 2 ep 2": (1, {"dp": 2, "dp_shard": 2, "ep": 2, "m": 2}, "pp 2 dp_shard 2 ep 2 (from pp 4)"),
    # experts FSDP-sharded (dp_shard / ep = 2 ranks hold each rank's experts, a row each)
    "pp 1 dp_shard 4 ep 2 (from ep 2)": (1, {"dp_shard": 4, "ep": 2, "m": 2}, "uninterrupted"),
    "pp 1 dp_shard 4 ep 2 again (same)": (1, {"dp_shard": 4, "ep": 2, "m": 2}, "pp 1 dp_shard 4 ep 2 (from ep 2)"),
    "pp 2 dp 2 (ep 1, from dp_shard 4)": (2, {"dp": 2}, "pp 1 dp_shard 4 ep 2 (from ep 2)"),
    "pp 2 dp_shard 2 ep 2 (from dp_shard 4)": (2, {"dp_shard": 2, "ep": 2}, "pp 1 dp_shard 4 ep 2 (from ep 2)"),
    "pp 1 dp_shard 2 tp 2 ep 2 (from dp_shard 4)": (1, {"dp_shard": 2, "tp": 2, "ep": 2, "m": 2},
                                                    "pp 1 dp_shard 4 ep 2 (from ep 2)"),
}
RESUMED_8 = {  # on 8 ranks, Mixtral only, saved at pp 1 x dp 2 x dp_shard 4 x ep 2: the experts' HSDP
    "pp 1 dp 2 dp_shard 4 ep 2 (same)": (1, {"dp": 2, "dp_shard": 4, "ep": 2, "m": 1}, "uninterrupted"),
    "pp 2 dp_shard 4 ep 2": (2, {"dp_shard": 4, "ep": 2, "m": 2}, "uninterrupted"),
    "pp 2 dp 4 (ep 1)": (2, {"dp": 4, "m": 2}, "pp 2 dp_shard 4 ep 2"),
    "pp 1 dp 2 dp_shard 4 ep 2 (from ep 1)": (1, {"dp": 2, "dp_shard": 4, "ep": 2, "m": 1}, "pp 2 dp 4 (ep 1)"),
}
RESUMED_6 = {  # on 6 ranks (batches of 12), saved at dp_shard 6 x ep 2: 3 shards of 2 experts, one holds none
    "pp 1 dp_shard 6 ep 2 (same)": (1, {"dp_shard": 6, "ep": 2, "m": 1}, "uninterrupted"),
    "pp 2 dp 3 (ep 1)": (2, {"dp": 3, "m": 2}, "uninterrupted"),
    "pp 1 dp_shard 6 ep 2 (from ep 1)": (1, {"dp_shard": 6, "ep": 2, "m": 1}, "pp 2 dp 3 (ep 1)"),
}
MATRICES = [  # (ranks, batch rows, models, where the uninterrupted run saves, resumed runs)
    (4, 8, ("mixtral", "qwen3-moe", "deepseek-v3"), (2, {"dp": 2, "ep": 2}), RESUMED),
    (8, 8, ("mixtral",), (1, {"dp": 2, "dp_shard": 4, "ep": 2, "m": 1}), RESUMED_8),
    (6, 12, ("mixtral",), (1, {"dp_shard": 6, "ep": 2, "m": 1}), RESUMED_6),
]


def checkpoints() -> int:
    """The ``--checkpoints`` matrices (module doc)."""
    from expert_checkpoint_cases import differing, entries, expert_checkpoints
    from hf_cases import make_batch
    from runtime_cases import relative_error

    from pipesched.runtime.launching.launch import spawn

    failed = False
    for ranks, rows, kinds, saved_at, resumed in MATRICES:
        batches = [make_batch(step, rows, 16) for step in range(2)]
        for kind in kinds:
            with tempfile.TemporaryDirectory() as folder:
                job = {"kind": kind, "schedule": "1f1b", "microbatches": 4, "folder": folder, "batches": batches,
                       "saved_at": saved_at, "resumed": resumed}
                got = spawn(expert_checkpoints, ranks, job, timeout_s=1800)[0]
                saved = {label: entries(path) for label, path in got["checkpoints"].items()}
            for label, (_, _, source) in resumed.items():
                run, same = got["runs"][label], "(same)" in label
                want = got["runs"][source if same else "uninterrupted"]  # same layout: the run it resumes, bit for bit
                moved = differing(saved[label], saved[source])
                error = max(abs(run["loss"] - want["loss"]) / abs(want["loss"]),
                            relative_error(run["params"], want["params"]))
                failed |= bool(moved) or error > (0 if same else BOUND)
                print(f"{ranks} ranks {kind:12} {label:44} state loaded bit for bit: {not moved}  "
                      f"step-2 error {error:.1e}", flush=True)
    return 1 if failed else 0


def main(worlds: list[int]) -> int:
    from expert_cases import launch
    from hf_cases import make_batch, make_model, reference
    from runtime_cases import relative_error

    batches = [make_batch(step, 8, 16) for step in range(3)]
    failed = False
    for ranks in worlds:
        runs = [(f"{kind} {name} pp{pp} " + " ".join(f"{k}{v}" for k, v in sizes.items()), kind,
                 pipesched.build_schedule(name, pp, m), sizes) for kind, name, pp, m, sizes in LAYOUTS[ranks]]
        for label, got in launch(runs, batches, ranks, timeout_s=1800).items():
            want = reference(make_model(label.split()[0], torch.float64), batches, optimizer="sgd")
            error = max(max(abs(a - b) / abs(b) for a, b in zip(got["losses"], want["losses"])),
                        relative_error(got["grads"], want["grads"]), relative_error(got["params"], want["params"]))
            exact = all(rank["measured"] == rank["predicted"] for rank in got["bytes"])
            params = [rank["measured"]["params"] for rank in got["bytes"]]
            failed |= error > BOUND or not exact
            print(f"{label:48} error {error:.1e}  params per rank {params} (= predicted: {exact})  "
                  f"median step {statistics.median(got['step_times']) * 1e3:.0f} ms", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    if "--checkpoints" in sys.argv[1:]:
        sys.exit(checkpoints())
    sys.exit(main([4, 8] if "--all" in sys.argv[1:] else [4]))
