"""How good is the advisor's pick on real ranks? Profile, advise, then measure every candidate.

For each model (train's mlp and gpt; llama: a tiny Hugging Face Llama, width 128 and 4 layers,
its config written to a temporary folder by this script, trained as ``--model hf:CONFIG.json``):
``advise --profile`` (the library calls behind it: profile the model with ZB-H1 on
2 local CPU ranks, then ZB-V with 2 chunks and 1F1B for the stage overhead and a fused backward's cost, then rank every schedule under the measured costs and a memory limit in M_B),
then run every distinct program among the candidates the advice ranked as fitting (candidates
that build the same program, as ZB-V and V-Half often do, are one row), on the same 2 ranks,
and take its median step. Reports, per model, whether the pick's measured step is within 5% of the fastest
measured, and the Spearman rank correlation between the predicted makespans and the measured
steps. The candidates are measured side by side: one pair of ranks builds a runtime for every
candidate, and the candidates take turns of ``--steps`` steps (after one warm-up step each turn)
for ``--rounds`` rounds, so that the machine's drift hits them alike; a candidate's figure is the
median of all its steps (the slowest rank's), and the spread of its per-round medians (largest
over smallest) is printed with them. Paired by round, the pick against every candidate: the
median over rounds of the ratio of their round medians (the worst is printed).

    PYTHONPATH=src python benchmarks/advise_accuracy.py [--models mlp,gpt,llama] [--steps 4] [--rounds 6]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from pipesched.advise.search import objective_option
from pipesched.registry import build_schedule, get_family
from pipesched.runtime.launching.launch import spawn
from pipesched.runtime.stages.copies import balanced_block_counts
from pipesched.training.models import get_model
from pipesched.training.profile import advise_from_profile, profile

RANKS, MICROBATCHES, BATCH, LIMIT = 2, 8, 64, 2.0  # the docs' example: advise --profile -p 2 -m 8 --memory-limit 2
NEAR = 0.05


def candidate_schedule(c) -> object:
    """The schedule a candidate names, built as the advisor built it."""
    return build_schedule(c.schedule, RANKS, c.microbatches, c.chunks, c.costs, c.memory_limit,
                          **objective_option(get_family(c.schedule), c.objective or "makespan"))


def turns_worker(rank: int, world: int, job: tuple) -> list[list[list[float]]]:
    """Every candidate's runtime on these ranks, taking turns; per candidate and round, the
    steps' times (the slowest rank's)."""
    import torch
    import torch.distributed as dist

    from pipesched.runtime.executor import PipelineRuntime, RuntimeOptions
    from pipesched.runtime.stages.staged_model import StagedModel
    from pipesched.runtime.launching.launch import rank_device
    from pipesched.training.optimizers import make_optimizer

    model, settings, steps, rounds = job
    md = get_model(model)
    x0, _ = md.batch(0, BATCH, 0)
    runtimes = []
    for schedule, recompute in settings:
        blocks = tuple(balanced_block_counts(md.block_costs, schedule))
        runtimes.append(PipelineRuntime(
            StagedModel(md.build_block, md.num_blocks, x0[: BATCH // schedule.microbatches], block_counts=blocks,
                        tied=md.tied),
            schedule, md.loss_fn, make_optimizer("sgd", 0.05),
            options=RuntimeOptions(seed=0, device=rank_device(),
                                   recompute="all" if recompute != "none" else None)))
    batches = [md.batch(i, BATCH, 0) for i in range(4)]
    times = [[[] for _ in range(rounds)] for _ in runtimes]
    for turn in range(rounds):
        for i, rt in enumerate(runtimes):
            for j in range(steps + 1):  # the first step of a turn warms the caches up (not kept)
                t = rt.step(*batches[j % len(batches)]).step_time
                if j:
                    times[i][turn].append(t)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist()


def llama_config(folder: Path) -> str:
    """A tiny random-init Llama's config, written to ``folder`` (nothing is downloaded): the model
    name ``hf:CONFIG.json`` that train, profile and advise take."""
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
    path = folder / "llama.json"
    config.to_json_file(str(path))
    return f"hf:{path}"


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        for r, i in enumerate(order):
            out[i] = float(r)
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,gpt,llama",
                        help="mlp, gpt (train's models), llama (a tiny Hugging Face Llama)")
    parser.add_argument("--steps", type=int, default=4, help="steps of a candidate per turn (after a warm-up step)")
    parser.add_argument("--rounds", type=int, default=6, help="turns of every candidate")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            model = llama_config(Path(folder)) if name == "llama" else name
            measure(model, name, args.steps, args.rounds)


def measure(model: str, name: str, steps: int, rounds: int) -> None:
    """Profile and advise ``model``, measure every distinct candidate that fits in ``rounds``
    rounds of ``steps`` steps, and print its table under ``name``."""
    prof = profile(model, RANKS, MICROBATCHES, BATCH)
    advice = advise_from_profile(prof, LIMIT)
    # candidates that build the same program are one schedule to measure (zb-v, v-half, v-min and
    # zb-auto at 2 chunks often are): measured twice, the faster of two noisy figures of one
    # program would count as beating the pick
    distinct: dict[tuple, tuple] = {}
    for c in advice.fitting:
        schedule = candidate_schedule(c)
        key = (schedule.to_csv(), c.recompute)
        if key in distinct:
            distinct[key][2].append(c.label())
        else:
            distinct[key] = (c, schedule, [c.label()])
    ranked = [c for c, _, _ in distinct.values()]
    names = [" = ".join(labels) for _, _, labels in distinct.values()]
    settings = [(schedule, c.recompute) for c, schedule, _ in distinct.values()]
    per_round = spawn(turns_worker, RANKS, (model, settings, steps, rounds), timeout_s=1800)[0]
    medians = [statistics.median(t for r in rounds_ for t in r) for rounds_ in per_round]
    per = [[statistics.median(r) for r in rounds_] for rounds_ in per_round]
    print(f"\n{name}: {len(advice.fitting)} candidates that fit, {len(ranked)} distinct programs (p={RANKS}, m={MICROBATCHES}, limit {LIMIT:g} M_B), "
          f"{rounds} rounds of {steps} steps; profile: F,I,W "
          + ",".join(f"{x:.2f}" for x in (prof.costs().F, prof.costs().B, prof.costs().W))
          + f" ms, stage overhead {1e3 * prof.stage_overhead:.3f} ms, full backward {1e3 * prof.full_backward:.2f} ms "
          + "(steps measured over zb-h1's: " + ", ".join(f"{k} {v:.3f}" for k, v in prof.ratios.items()) + ")")
    print("| # | candidate | predicted ms | measured ms (median) | spread | per-round medians ms |")
    print("|---|---|---|---|---|---|")
    for i, (c, label, t, times) in enumerate(zip(ranked, names, medians, per)):
        print(f"| {i + 1} | {label} | {c.makespan:.2f} | {1e3 * t:.2f} | {max(times) / min(times):.2f}x | "
              f"{', '.join(f'{1e3 * x:.1f}' for x in times)} |")
    fastest = min(medians)
    pick = medians[0]
    print(f"pick {names[0]}: {1e3 * pick:.2f} ms; fastest measured "
          f"{names[medians.index(fastest)]}: {1e3 * fastest:.2f} ms; pick / fastest = {pick / fastest:.3f} "
          f"({'within' if pick <= (1 + NEAR) * fastest else 'NOT within'} 5%); "
          f"Spearman(predicted, measured) = {spearman([c.makespan for c in ranked], medians):.2f}")
    # the rounds paired: the pick against each candidate round by round (the drift between rounds
    # cancels); the worst of these is the pick against the candidate that beats it most often
    paired = [statistics.median(p / q for p, q in zip(per[0], other)) for other in per]
    worst = max(range(len(per)), key=lambda i: paired[i])
    print(f"paired by round: pick / {names[worst]} = {paired[worst]:.3f} (median over rounds), "
          f"{'within' if paired[worst] <= 1 + NEAR else 'NOT within'} 5%")


if __name__ == "__main__":
    main()
