"""The layout advisor on the Zero Bubble paper's configurations (Qi et al. 2024, Table 3).

Run: PYTHONPATH=src python benchmarks/layout.py   (prints Markdown for RESULTS.md)

Models (layers, heads, hidden, sequence 1024, microbatch size, GPUs, microbatch counts), from
the paper's Table 3 ("Models and fixed settings used for experiments"; Qi, Wan, Huang, Lin, "Zero
Bubble Pipeline Parallelism", ICLR 2024, arXiv:2401.10241): 1.5B (22, 24, 2304, b=6, 8 GPUs, m
24/32/64), 6.2B (30, 64, 4096, b=3, 8, 24/32/64), 14.6B (46, 64, 5120, b=1, 16, 48/64/128), 28.3B
(62, 64, 6144, b=1, 32, 96/128/256). What could be checked here: the layer counts, GPUs and
microbatch counts are those of /work/shared/reference/schedules.md (2.1, "Evaluation grid"), the
layer counts follow the authors' README advice of ``k x p - 2`` layers
(github.com/sail-sg/zero-bubble-pipeline-parallelism), and the hidden sizes give the models'
names: :func:`parameter_table` prints 12 L h^2 + V h at vocabulary 51200 (1.52B, 6.25B, 14.74B,
28.40B). The table's own text was not reachable from this machine (the searchable copies of the
paper gave only its first page), so heads and microbatch sizes rest on the paper as transcribed.
A100 80 GB at 150 effective TFLOP/s, 100 GB/s between pipeline neighbours, 25 GB/s between
replicas. Costs and memory come from the paper's per-layer formulas (advise/estimate.py).

1. At the paper's layout (pure pipeline, pp = GPUs) and microbatch counts: the predicted step of
   1F1B, interleaved 1F1B (2 chunks), ZB-1p and ZB-2p. ZB-1p and ZB-2p are the paper's automatic
   schedules at p and 2p microbatches of activations; here their handcrafted counterparts zb-h1
   (the paper: "ZB-1p is close to ZB-H1") and zb-h2 (zero bubble at 2p), since zb-auto's search
   at p=32, m=256 takes too long for this shared machine.
2. ``advise --gpus G`` over every pp x dp with the global batch b x m: the recommended layout,
   and for every layout whether its best candidate predicts a step no slower than 1F1B there.
"""

from __future__ import annotations

from pipesched.advise import advise
from pipesched.advise.estimate import Hardware, TransformerCosts, TransformerSpec
from pipesched.advise.layout import advise_layouts
from pipesched.errors import PipeschedError
from pipesched.registry import get_family

CONFIGS = [
    ("1.5B", 22, 24, 2304, 6, 8, (24, 32, 64)),
    ("6.2B", 30, 64, 4096, 3, 8, (24, 32, 64)),
    ("14.6B", 46, 64, 5120, 1, 16, (48, 64, 128)),
    ("28.3B", 62, 64, 6144, 1, 32, (96, 128, 256)),
]
HARDWARE = Hardware(tflops=150, bandwidth=100, gpu_memory=80)
DP_BANDWIDTH = 25
PAPER = ("1f1b", "interleaved-1f1b", "ZB-1p", "ZB-2p")
LAYOUT_FAMILIES = [get_family(n) for n in ("1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v")]


def _spec(layers, heads, hidden, b, vocab=51200):
    return TransformerSpec(layers, hidden, 1024, b, heads=heads, vocab=vocab)


def parameter_table() -> list[str]:
    """Each model's parameters from its dimensions (layers and one vocabulary embedding), against
    the size in its name: the check that the dimensions are the paper's models."""
    lines = ["| model | layers | heads | hidden | parameters from the dimensions |", "|---|---|---|---|---|"]
    for name, layers, heads, hidden, b, _gpus, _ms in CONFIGS:
        spec = _spec(layers, heads, hidden, b)
        lines.append(f"| {name} | {layers} | {heads} | {hidden} | {(layers * spec.layer_params + spec.embedding_params) / 1e9:.2f}B |")
    return lines


def _paper_row(spec, gpus, m) -> dict:
    """Predicted step (ms) of each of the paper's four schedules at pp = gpus, or why not."""
    model = TransformerCosts(spec, gpus, HARDWARE)
    out = {}
    for label, family, limit in (("1f1b", "1f1b", None), ("interleaved-1f1b", "interleaved-1f1b", None),
                                 ("ZB-1p", "zb-h1", None), ("ZB-2p", "zb-h2", None)):
        try:
            advice = advise(gpus, cost_model=model, microbatches=m, families=[get_family(family)], max_chunks=2)
            best = advice.recommended
            out[label] = (best.makespan, best.fits, best.memory_gb)
        except PipeschedError:  # nothing of this family fits the GPU memory
            out[label] = (None, False, None)
    return out


def paper_table(balanced: bool = False) -> list[str]:
    """The paper's four schedules at each configuration; ``balanced``: layers rounded up to a
    multiple of 2p and no embedding or head, so that interleaving's 2p stages are even."""
    lines = [
        "| model | GPUs | m | 1F1B ms | interleaved ms | ZB-1p ms | ZB-2p ms | order (fastest first, fitting 80 GB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, layers, heads, hidden, b, gpus, ms in CONFIGS:
        spec = _spec(-(-layers // (2 * gpus)) * 2 * gpus, heads, hidden, b, None) if balanced else _spec(layers, heads, hidden, b)
        for m in (ms[:1] if balanced else ms):
            row = _paper_row(spec, gpus, m)
            cells = []
            for label in PAPER:
                t, fits, gb = row[label]
                cells.append("over 80 GB" if t is None else f"{t:.0f}" + ("" if fits else f" (over: {gb:.0f} GB)"))
            fitting = sorted((row[k][0], k) for k in PAPER if row[k][0] is not None and row[k][1])
            lines.append(f"| {name} | {gpus} | {m} | " + " | ".join(cells) + " | " + " < ".join(k for _, k in fitting) + " |")
    return lines


def layout_table() -> list[str]:
    lines = [
        "| model | GPUs | global batch | recommended | step ms | 1F1B, same layout | pure pipeline (pp=GPUs) best | every layout's best <= its 1F1B |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, layers, heads, hidden, b, gpus, ms in CONFIGS:
        spec = _spec(layers, heads, hidden, b)
        model = TransformerCosts(spec, gpus, HARDWARE)
        batch = b * ms[1]
        advice = advise_layouts(gpus, model, batch, dp_bandwidth=DP_BANDWIDTH, families=LAYOUT_FAMILIES, max_chunks=2)
        best = advice.recommended
        base = advice.baseline(best.pp, best.dp)
        layouts = {(c.pp, c.dp) for c in advice.candidates}
        ok = all(
            min(c.step_time for c in advice.candidates if (c.pp, c.dp) == lay) <= advice.baseline(*lay).step_time + 1e-9
            for lay in layouts if advice.baseline(*lay) is not None
        )
        pure = [c for c in advice.candidates if c.pp == gpus]
        lines.append(
            f"| {name} | {gpus} | {batch} | pp={best.pp} x dp={best.dp}, {best.candidate.schedule} "
            f"v={best.candidate.chunks} m={best.candidate.microbatches} | {best.step_time:.0f} | "
            f"{base.step_time:.0f} | " + (f"{pure[0].candidate.schedule} {pure[0].step_time:.0f}" if pure else "does not fit")
            + f" | {'yes' if ok else 'NO'} ({len(layouts)} layouts) |"
        )
    return lines


if __name__ == "__main__":
    print("\n".join(parameter_table()))
    print()
    print("\n".join(paper_table()))
    print()
    print("\n".join(paper_table(balanced=True)))
    print()
    print("\n".join(layout_table()))
