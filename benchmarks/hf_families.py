"""Every Hugging Face family pipesched.hf registers beyond the first seven, under the schedules:
the full matrix behind the one-schedule-per-family sample of tests/test_hf_pipeline.py.

Each family's real config (its config class's defaults) shrunk as the twin check shrinks it
(``tests/hf_cases.family_config``), three steps on the tests' batches (8 x 16, labels -100 in
different numbers per row):

- float64 throughout (``hf_cases.Float64Throughout``), AdamW: 2 ranks under 1f1b, zb-v,
  interleaved-zb and dualpipev; 4 ranks under zb-v (a V) and 1f1b (a loop), 6 layers for the
  8 stages of the V; against the model on the whole batch, held to 1e-10 relative;
- fp32, SGD: 2 ranks under zb-v, against the fp32 model, held to 1e-5 relative.

Prints, per family, the largest relative error of the losses, first gradients and final weights
over its float64 runs, and of its fp32 run; exits 1 if any is over its bound.

    PYTHONPATH=src:tests python benchmarks/hf_families.py [--families gemma,falcon]
"""

from __future__ import annotations

import argparse
import sys

import torch

import pipesched
from pipesched.runtime.launching.launch import spawn

BOUNDS = {"float64": 1e-10, "fp32": 1e-5}


def runs(families: list[str], ranks: int) -> list[tuple]:
    out = []
    for kind in families:
        if ranks == 2:
            out += [(f"{kind} {name}", kind, pipesched.build_schedule(name, 2, 4), {})
                    for name in ("1f1b", "zb-v", "interleaved-zb", "dualpipev")]
            out.append((f"{kind} zb-v fp32", kind, pipesched.build_schedule("zb-v", 2, 4),
                        {"model_dtype": torch.float32, "optimizer": "sgd"}))
        else:
            out += [(f"{kind}/6 {name}", f"{kind}/6", pipesched.build_schedule(name, 4, 4), {})
                    for name in ("zb-v", "1f1b")]
    return out


def errors(got: dict, want: dict) -> tuple[float, float, float]:
    from runtime_cases import relative_error

    loss = max(abs(a - b) / abs(b) for a, b in zip(got["losses"], want["losses"]))
    return loss, relative_error(got["grads"], want["grads"]), relative_error(got["params"], want["params"])


def main() -> int:
    from hf_cases import FAMILIES, make_batch, make_model, reference, run_pipelines

    parser = argparse.ArgumentParser()
    parser.add_argument("--families", default=",".join(FAMILIES))
    families = parser.parse_args().families.split(",")
    batches = [make_batch(step, 8, 16) for step in range(3)]
    results = {}
    for ranks in (2, 4):
        results.update(spawn(run_pipelines, ranks, {"runs": runs(families, ranks), "batches": batches},
                             timeout_s=600)[0])
    worst: dict = {}
    for label, got in results.items():
        kind, precision = label.split()[0], "fp32" if label.endswith("fp32") else "float64"
        dtype = torch.float32 if precision == "fp32" else torch.float64
        want = reference(make_model(kind, dtype), batches, optimizer="sgd" if precision == "fp32" else "adamw")
        row = worst.setdefault((kind.partition("/")[0], precision), [0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1:] = [max(old, new) for old, new in zip(row[1:], errors(got, want))]
    failed = False
    print("| family | precision | runs | loss | gradients | weights |")
    print("|---|---|---|---|---|---|")
    for (family, precision), (count, loss, grads, params) in sorted(worst.items()):
        print(f"| {family} | {precision} | {count} | {loss:.1e} | {grads:.1e} | {params:.1e} |")
        failed |= max(loss, grads, params) > BOUNDS[precision]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
