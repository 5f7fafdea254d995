"""Advisor figures: search time at p=16, the recommendation checked against re-simulation over a
grid, and the cases where the guide's generic advice is beaten.

Run: PYTHONPATH=src python benchmarks/advise.py [--no-measured]   (prints Markdown for RESULTS.md)

The measured part (needs torch) profiles the MLP on 2 local ranks, lets the advisor rank the
schedules from the measured costs, then runs each ranked candidate for real, in rounds (every
candidate once per round, so they share the machine's noise), and compares the chosen one's
median step time with the best measured.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import pipesched
from pipesched import Costs, build_schedule, simulate
from pipesched.advise import NoCandidateFitsError, advise
from pipesched.advise.parallel import default_workers

SKEWED = Costs(1, 1.4, 0.6, comm=0.1)


def timed(repeats: int, **kwargs):
    times, advice = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        advice = advise(**kwargs)
        times.append(time.perf_counter() - start)
    return statistics.median(times), advice


def speed() -> list[str]:
    lines = [f"Load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs.", "",
             "| setup | candidates simulated | workers | median time (3 runs) |", "|---|---|---|---|"]
    cases = [
        ("p=16, m=64, F,B,W=1,1.4,0.6 comm 0.1, limit 16", dict(ranks=16, memory_limit=16, microbatches=64, costs=SKEWED)),
        ("p=16, G=512 b=4 (m searched), same costs, limit 16",
         dict(ranks=16, memory_limit=16, global_batch=512, microbatch_size=4, costs=SKEWED)),
    ]
    for label, kwargs in cases:
        for workers in sorted({1, 2, default_workers(99)}):
            seconds, advice = timed(3, workers=workers, **kwargs)
            lines.append(f"| {label} | {len(advice.candidates)} | {workers} | {seconds:.2f} s |")
    return lines


def grid() -> tuple[int, int, int, list[str]]:
    """(configurations, recommendation == fastest fitting and re-simulates identically, no fit,
    the others described)."""
    configs = ok = nofit = 0
    others = []
    for p in (2, 4, 8):
        for m in (p - 1 or 1, p, 2 * p, 4 * p):
            for costs in (Costs(), SKEWED, Costs(1, 1.2, 0.8, comm=0.05, stage_multipliers=(1.3, 1, 1, 1.3))):
                for limit in (p / 2, p, None):
                    configs += 1
                    try:
                        advice = advise(p, limit, microbatches=m, costs=costs)
                    except NoCandidateFitsError:
                        nofit += 1
                        continue
                    rows = advice.to_json()
                    best = rows[0]
                    c = best["costs"]
                    rc = Costs(c["F"], c["B"], c["W"], comm=c["comm"], stage_multipliers=c["stage_multipliers"])
                    extra = {"objective": best["objective"]} if best.get("objective") else {}
                    again = simulate(build_schedule(best["schedule"], p, best["microbatches"], best["chunks"], rc,
                                                    best["memory_limit"], **extra), rc)
                    fastest = min(r["makespan"] for r in rows if r["fits"])
                    if (abs(again.makespan - best["makespan"]) < 1e-9 and best["makespan"] <= fastest + 1e-9
                            and (limit is None or again.max_peak_memory <= limit + 1e-9)):
                        ok += 1
                    else:
                        others.append(
                            f"p={p} m={m} {costs} limit={limit}: {best['schedule']} chunks={best['chunks']} "
                            f"advised {best['makespan']:.4g}, rebuilt {again.makespan:.4g} "
                            f"(peak {again.max_peak_memory:g})"
                        )
    return configs, ok, nofit, others


def guide_cases() -> list[str]:
    lines = ["| case | recommended | vs 1f1b | note |", "|---|---|---|---|"]
    cases = [
        ("F=B=W, p=8, m=32, limit p", dict(ranks=8, memory_limit=8, microbatches=32)),
        ("F=B=W, p=8, m=32, limit p/2+1 (half of 1F1B)", dict(ranks=8, memory_limit=5, microbatches=32)),
        ("F,B,W=1,1.4,0.6 comm 0.1, p=8, m=32, limit p", dict(ranks=8, memory_limit=8, microbatches=32, costs=SKEWED)),
        ("F=B=W, p=8, m=6 (m <= p), limit p", dict(ranks=8, memory_limit=8, microbatches=6)),
    ]
    for label, kwargs in cases:
        try:
            advice = advise(**kwargs)
        except NoCandidateFitsError as err:
            lines.append(f"| {label} | none fits | - | {err} |")
            continue
        best = advice.recommended
        note = advice.notes[0] if advice.notes else ""
        speedup = f"{best.speedup_vs_1f1b:.3f}x" if best.speedup_vs_1f1b else "-"
        lines.append(f"| {label} | {best.label()} | {speedup} | {note} |")
    return lines


def measured(rounds: int = 3, steps: int = 6, top: int = 6) -> list[str]:
    from pipesched.advise.search import objective_option
    from pipesched.registry import get_family
    from pipesched.training.profile import advise_from_profile, profile
    from pipesched.training.train import TrainConfig, run

    p, m, batch = 2, 8, 64
    prof = profile("mlp", p, m, batch, steps=5)
    advice = advise_from_profile(prof, memory_limit=p)
    ranked = advice.fitting[:top]
    schedules = [
        build_schedule(c.schedule, p, c.microbatches, c.chunks, c.costs, c.memory_limit,
                       **objective_option(get_family(c.schedule), advice.objective))
        for c in ranked
    ]
    times: list[list[float]] = [[] for _ in ranked]
    for _ in range(rounds):
        for i, schedule in enumerate(schedules):
            result = run(TrainConfig("mlp", schedule, steps, batch))
            times[i].extend(result.step_times[1:])
    medians = [1e3 * statistics.median(t) for t in times]
    best = min(medians)
    lines = [
        f"Profile: {prof.summary()}", "",
        f"Advisor ranking from the measured costs (memory limit {p} M_B), then each candidate run "
        f"{rounds} rounds x {steps - 1} measured steps, side by side:", "",
        "| rank | candidate | predicted (ms) | measured median step (ms) | vs best measured |", "|---|---|---|---|---|",
    ]
    for i, (c, ms) in enumerate(zip(ranked, medians)):
        lines.append(f"| {i + 1} | {c.label()} | {c.makespan:.1f} | {ms:.1f} | {ms / best:.3f} |")
    lines += ["", f"Chosen (rank 1) / best measured = {medians[0] / best:.3f} (target <= 1.05)."]
    return lines


def main() -> None:
    print("## Advisor\n")
    print(f"Families searched: {', '.join(pipesched.schedule_names())}; chunks up to 4.\n")
    print("### Search time\n")
    print("\n".join(speed()))
    configs, ok, nofit, others = grid()
    print("\n### Recommendation = fastest fitting candidate, re-simulated from its JSON fields\n")
    print(f"{ok} of {configs - nofit} configurations agree exactly ({nofit} of {configs} had no fitting "
          "candidate and raised the 'smallest feasible limit' error).\n")
    for line in others:
        print(f"- differs: {line}")
    if others:
        print()
    print("### Where the guide's generic advice is beaten\n")
    print("\n".join(guide_cases()))
    if "--no-measured" not in sys.argv:
        print("\n### Measured: the chosen schedule against the others it ranked (MLP, 2 ranks, gloo)\n")
        print("\n".join(measured()))


if __name__ == "__main__":
    main()
