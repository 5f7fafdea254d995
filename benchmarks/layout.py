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
   1F1B, interleaved 1F1B (2 chunks, with the layer assignment the advisor chose, and the best
   of 2 to 4 chunks), ZB-1p and ZB-2p; the same with evenly splitting layer counts; every
   schedule under the authors' padded split; interleaved's microbatch group. ZB-1p and ZB-2p are the paper's automatic
   schedules at p and 2p microbatches of activations; here their handcrafted counterparts zb-h1
   (the paper: "ZB-1p is close to ZB-H1") and zb-h2 (zero bubble at 2p), since zb-auto's search
   at p=32, m=256 takes too long for this shared machine.
2. ``advise --gpus G`` over every pp x dp with the global batch b x m: the recommended layout,
   and for every layout whether its best candidate predicts a step no slower than 1F1B there.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesched.advise import advise
from pipesched.advise.estimate import Hardware, TransformerCosts
from pipesched.advise.layout import advise_layouts
from pipesched.advise.transformer import TransformerSpec
from pipesched.errors import ConfigError, PipeschedError
from pipesched.registry import get_family

CONFIGS = [
    ("1.5B", 22, 24, 2304, 6, 8, (24, 32, 64)),
    ("6.2B", 30, 64, 4096, 3, 8, (24, 32, 64)),
    ("14.6B", 46, 64, 5120, 1, 16, (48, 64, 128)),
    ("28.3B", 62, 64, 6144, 1, 32, (96, 128, 256)),
]
HARDWARE = Hardware(tflops=150, bandwidth=100, gpu_memory=80)
DP_BANDWIDTH = 25
PAPER = ("1f1b", "interleaved-1f1b", "ZB-1p", "ZB-2p")  # interleaved at 2 chunks
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
    """The best candidate (or None: nothing fits 80 GB) of each of the paper's four schedules at
    pp = gpus, interleaving at 2 chunks (Megatron's usual) and at the best of 2 to 4."""
    model = TransformerCosts(spec, gpus, HARDWARE)
    out = {}
    for label, family, chunks in (("1f1b", "1f1b", (1,)), ("interleaved-1f1b", "interleaved-1f1b", (2,)),
                                  ("interleaved, best v", "interleaved-1f1b", (2, 3, 4)),
                                  ("ZB-1p", "zb-h1", (1,)), ("ZB-2p", "zb-h2", (1,))):
        try:
            advice = advise(gpus, cost_model=model, microbatches=m, families=[get_family(family)], max_chunks=max(chunks))
            out[label] = next((c for c in advice.fitting if c.chunks in chunks), None)
        except PipeschedError:  # no split of the layers, or nothing of this family fits the GPU memory
            out[label] = None
    return out


def _ms(c) -> str:
    return "does not fit" if c is None else f"{c.makespan:.0f}"


def _between(one, inter, zb1) -> str:
    """Where interleaved lands against 1F1B and ZB-1p (times within 0.1% count as a tie)."""
    if inter is None:
        return "NO: does not fit"
    if inter.makespan > one.makespan * 1.001:
        return "NO: slower than 1F1B"
    if inter.makespan < zb1.makespan * 0.999:
        return "NO: faster than ZB-1p"
    return "yes" if inter.makespan > zb1.makespan * 1.001 else "tie with ZB-1p"


def _split(c) -> str:
    """How the candidate's layers went to its stages: the advisor's choice, when it had one."""
    if c is None:
        return "-"
    return c.layer_assignment or "one way only"


def paper_table(balanced: bool = False) -> list[str]:
    """The paper's four schedules at each configuration; ``balanced``: layers rounded up to a
    multiple of 2p and no embedding or head, so that interleaving's 2p stages are even."""
    lines = [
        "| model | GPUs | m | 1F1B ms | interleaved ms (v=2) | its layer assignment | ZB-1p ms | ZB-2p ms "
        "| order (fastest first, fitting 80 GB) | interleaved between 1F1B and ZB-1p | interleaved, best v of 2-4 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, layers, heads, hidden, b, gpus, ms in CONFIGS:
        spec = _spec(-(-layers // (2 * gpus)) * 2 * gpus, heads, hidden, b, None) if balanced else _spec(layers, heads, hidden, b)
        for m in (ms[:1] if balanced else ms):
            row = _paper_row(spec, gpus, m)
            fitting = sorted((row[k].makespan, k) for k in PAPER if row[k] is not None)
            one, inter, zb1 = row["1f1b"], row["interleaved-1f1b"], row["ZB-1p"]
            best = row["interleaved, best v"]
            best_text = "-" if best is None else f"v={best.chunks}: {best.makespan:.0f} ({_split(best)})"
            lines.append(
                f"| {name} | {gpus} | {m} | {_ms(one)} | {_ms(inter)} | {_split(inter)} | {_ms(zb1)} | {_ms(row['ZB-2p'])} "
                f"| {' < '.join(k for _, k in fitting)} | {_between(one, inter, zb1)} | {best_text} |"
            )
    return lines


@dataclass(frozen=True)
class PaddedSplit(TransformerCosts):
    """The layer split the authors' code runs (its ``--allow-padding-num-layers``): the model is
    padded to a multiple of p layers, every stage gets the same number of the padded layers and
    the first and last stage each lose one (so the embedding and the head take a layer's place).
    Interleaving needs the padded layers per rank to divide into the chunks; otherwise the code
    refuses, and so does this split."""

    def layers_per_stage(self, stages: int, placement: str) -> tuple[int, ...]:
        padded = -(-self.spec.layers // self.ranks) * self.ranks
        per_stage, rest = divmod(padded, stages)
        if rest:
            raise ConfigError(f"{padded} padded layers do not split into {stages} stages")
        missing = padded - self.spec.layers
        counts = [per_stage] * stages
        counts[0] -= missing // 2
        counts[-1] -= missing - missing // 2
        return tuple(counts)


def padded_table() -> list[str]:
    """The four schedules, every one under the authors' padded split (interleaved at the fastest
    chunk count that split allows)."""
    lines = [
        "| model | GPUs | m | 1F1B ms | interleaved ms (v) | ZB-1p ms | ZB-2p ms | interleaved between 1F1B and ZB-1p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, layers, heads, hidden, b, gpus, ms in CONFIGS:
        model = PaddedSplit(_spec(layers, heads, hidden, b), gpus, HARDWARE)
        for m in ms:
            best = {}
            for label, family, chunks in (("1f1b", "1f1b", 1), ("interleaved", "interleaved-1f1b", 4),
                                          ("ZB-1p", "zb-h1", 1), ("ZB-2p", "zb-h2", 1)):
                try:
                    advice = advise(gpus, cost_model=model, microbatches=m, families=[get_family(family)], max_chunks=chunks)
                    best[label] = advice.fitting[0] if advice.fitting else None
                except PipeschedError:
                    best[label] = None
            inter = best["interleaved"]
            lines.append(
                f"| {name} | {gpus} | {m} | {_ms(best['1f1b'])} | "
                + ("-" if inter is None else f"{inter.makespan:.0f} (v={inter.chunks})")
                + f" | {_ms(best['ZB-1p'])} | {_ms(best['ZB-2p'])} | {_between(best['1f1b'], inter, best['ZB-1p'])} |"
            )
    return lines


def group_table() -> list[str]:
    """Interleaved (2 chunks) with Megatron's default group of p microbatches against the groups
    the interleaved family tries under a memory limit (also the largest Megatron accepts up to
    2p: ``microbatch_group_size_per_vp_stage``, ``m % G`` 0 or at least p), each layer
    assignment, the GPU's memory checked as the advisor checks it; where uneven chunks made the
    default lose to 1F1B."""
    from pipesched.placement import loop_placement
    from pipesched.schedule import Schedule
    from pipesched.schedules.interleaved import group_candidates, rank_order
    from pipesched.simulate import simulate

    lines = ["| model | GPUs | m | 1F1B ms | interleaved, G = p | best G | its layer assignment | ms | activations GB (fullest rank) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, layers, heads, hidden, b, gpus, ms in CONFIGS:
        if name not in ("1.5B", "14.6B"):
            continue
        model = TransformerCosts(_spec(layers, heads, hidden, b), gpus, HARDWARE)
        for m in ms:
            one = advise(gpus, cost_model=model, microbatches=m, families=[get_family("1f1b")]).recommended
            tried = []
            for assignment in model.layer_assignments(2 * gpus, "loop"):
                split = model.with_layer_assignment(assignment)
                costs, sizes = split.costs(2 * gpus, "loop", 1.0), split.stage_sizes(2 * gpus, "loop", 1.0)
                budgets = split.activation_budgets(2 * gpus, "loop")
                for group in group_candidates(gpus, m, larger=True):
                    orders = tuple(tuple(rank_order(r, gpus, m, 2, group)) for r in range(gpus))
                    result = simulate(Schedule(gpus, m, loop_placement(gpus, 2), orders), costs, sizes)
                    if all(x <= y for x, y in zip(result.peak_memory_bytes, budgets)):
                        tried.append((result.makespan, group, assignment, max(result.peak_memory_bytes) / 1e9))
            at_p = min(t for t in tried if t[1] == gpus)
            best = min(tried)
            lines.append(f"| {name} | {gpus} | {m} | {one.makespan:.0f} | {at_p[0]:.0f} | {best[1]} | {best[2]} | "
                         f"{best[0]:.0f} | {best[3]:.1f} (G = p: {at_p[3]:.1f}) |")
    return lines


def layout_table() -> list[str]:
    lines = [
        "| model | GPUs | global batch | recommended | its layers per stage | step ms | 1F1B, same layout | pure pipeline (pp=GPUs) best | every layout's best <= its 1F1B |",
        "|---|---|---|---|---|---|---|---|---|",
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
            f"v={best.candidate.chunks} m={best.candidate.microbatches} | {_layers(best.candidate)} | {best.step_time:.0f} | "
            f"{base.step_time:.0f} | " + (f"{pure[0].candidate.schedule} {pure[0].step_time:.0f}" if pure else "does not fit")
            + f" | {'yes' if ok else 'NO'} ({len(layouts)} layouts) |"
        )
    return lines


def _layers(c) -> str:
    split = ",".join(map(str, c.layers_per_stage))
    return split + (f" ({c.layer_assignment})" if c.layer_assignment else "")


if __name__ == "__main__":
    print("\n".join(parameter_table()))
    print()
    print("\n".join(paper_table()))
    print()
    print("\n".join(paper_table(balanced=True)))
    print()
    print("\n".join(padded_table()))
    print()
    print("\n".join(group_table()))
    print()
    print("\n".join(layout_table()))
