"""zb-auto's recomputation dimension: its choice per memory limit, with and without it.

    python benchmarks/auto_recompute.py

F,B,W = 1,1.4,0.6 and comm 0.1 (the skewed costs of benchmarks/auto.py); a recomputed stage
keeps a tenth of its activations (its input: a transformer layer's input is 2 of its ~32 sbh
bytes, so a tenth is conservative for a stage of one layer and generous for several). For each
limit (M_B per rank): zb-auto's makespan and origin without the dimension (``recompute_input``
not given) and with it, and the stages it recomputes. Simulated, so the figures are exact.
Prints a Markdown table for RESULTS.md.
"""

from __future__ import annotations

from pipesched.auto import build_auto
from pipesched.costs import Costs
from pipesched.errors import ConfigError
from pipesched.memory import schedule_recompute
from pipesched.simulate import simulate

COSTS = Costs(F=1, B=1.4, W=0.6, comm=0.1)
INPUT_SHARE = 0.1
CASES = [(4, 8), (8, 16)]
LIMITS = (0.6, 0.8, 1, 1.5, 2, 3)


def choice(ranks: int, microbatches: int, limit: float, recompute_input) -> str:
    try:
        schedule = build_auto(ranks, microbatches, COSTS, limit, recompute_input=recompute_input)
    except ConfigError as err:
        return "fails: " + str(err).split(": ")[-1]
    result = simulate(schedule, COSTS)
    chosen = schedule_recompute(schedule)
    how = f"recompute {chosen.spec()}" if chosen else schedule.meta["origin"].split(" (")[0]
    return f"{result.makespan:.4g} ({how}, peak {result.max_peak_memory:.3g})"


def main() -> None:
    print("| p | m | limit (M_B) | zb-auto without recomputation | with it (input share 0.1) |")
    print("|---|---|---|---|---|")
    for ranks, microbatches in CASES:
        for limit in LIMITS + (ranks,):
            print(f"| {ranks} | {microbatches} | {limit:g} | {choice(ranks, microbatches, limit, None)} "
                  f"| {choice(ranks, microbatches, limit, INPUT_SHARE)} |")


if __name__ == "__main__":
    main()
