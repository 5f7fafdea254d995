"""Split backward on one transformer block: time(I) + time(W) against one full backward (B).

The runtime's own split (``pipesched.runtime.engine.split_backward``) against ordinary autograd on a
copy of the same block, alternating, medians. CPU runs on one thread; CUDA synchronises around
every timed phase, so launch overheads count as they would in a step.

    PYTHONPATH=src python benchmarks/split_block.py                   # CPU, the runtime benchmark's block
    PYTHONPATH=src python benchmarks/split_block.py --device cuda --dim 1024 --heads 16 --context 1024
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from time import perf_counter

import torch

from pipesched.runtime.engine.split_backward import (
    WeightGradStash,
    apply_weight_grads,
    make_weight_grads_deferrable,
)
from pipesched.training.models import TransformerBlock


def measure(device: str = "cpu", dim: int = 128, heads: int = 4, context: int = 32, batch: int = 8,
            repeats: int = 30, warmup: int = 5) -> dict:
    """Median F, B, I and W of one block (milliseconds) and (I + W) / B."""
    if device == "cpu":
        torch.set_num_threads(1)
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    plain = TransformerBlock(dim, heads).to(dev)
    split = copy.deepcopy(plain)
    stash = WeightGradStash()
    make_weight_grads_deferrable(split, stash)
    x = torch.randn(batch, context, dim, device=dev)
    g = torch.randn_like(x)
    times: dict[str, list[float]] = {"F": [], "B": [], "I": [], "W": []}

    def timed(key: str, fn, record: bool):
        sync()
        t0 = perf_counter()
        out = fn()
        sync()
        if record:
            times[key].append(perf_counter() - t0)
        return out

    for i in range(warmup + repeats):
        record = i >= warmup
        xi = x.clone().requires_grad_()
        y = timed("F", lambda: plain(xi), record)
        timed("B", lambda: y.backward(g), record)
        xi = x.clone().requires_grad_()
        y = split(xi)
        entries: list = []
        stash.collecting = entries
        timed("I", lambda: y.backward(g), record)
        stash.collecting = None
        timed("W", lambda: apply_weight_grads(entries), record)
        plain.zero_grad(set_to_none=True)
        split.zero_grad(set_to_none=True)
    med = {k: 1000 * statistics.median(v) for k, v in times.items()}
    return {"device": device, "dim": dim, "heads": heads, "context": context, "batch": batch,
            "F_ms": med["F"], "B_ms": med["B"], "I_ms": med["I"], "W_ms": med["W"],
            "ratio": (med["I"] + med["W"]) / med["B"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8, help="sequences per microbatch")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    r = measure(args.device, args.dim, args.heads, args.context, args.batch, args.repeats)
    print(
        f"split backward, transformer block width {r['dim']}, {r['batch']} x {r['context']} tokens on {r['device']}: "
        f"F {r['F_ms']:.3f} ms, full B {r['B_ms']:.3f} ms, I {r['I_ms']:.3f} + W {r['W_ms']:.3f} ms "
        f"-> (I+W)/B = {r['ratio']:.3f} (target <= 1.10)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
