"""What a run's ``zb-auto`` plans with: costs and a memory limit, from one profile (torch-free).

zb-auto exists to place F, I and W from their real durations, so ``train`` profiles the model
first (a few ZB-H1 steps on the same ranks: :func:`pipesched.training.profile.profile`) and
plans with the measured costs, as ``-s auto`` does for the advisor. ``--costs F,B,W`` (and
``--comm C``, the grammar of ``simulate`` and ``compare``) plans with given costs instead and
skips the profile unless the memory limit needs the measured sizes (``--costs 1,1,1``: the unit
costs, the plan ``simulate zb-auto`` makes). A byte ``--memory-limit``, or a limit without
``--recompute-input``, needs the activation sizes: the same profile gives them, so a run profiles
at most once. Under torchrun the profile, which starts its own local ranks, does not run for the
costs: the plan then uses ``--costs``, or unit costs, and says so. Planned from measured costs,
zb-auto is also planned for unit costs, and the measured costs pick between the two
(:meth:`ZbAutoInputs.plan`): never behind what train planned before it measured.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from .bounds import DEFAULT_TIMEOUT_S
from .costs import UNIT, Costs
from .errors import ConfigError
from .registry import build_schedule, get_family
from .schedule import Schedule
from .schedules.choose import best_schedule
from .simulate import simulate

if TYPE_CHECKING:
    from .training.profile import Profile

Say = Callable[[str], None]  # where a line for the user goes


def on_stderr(line: str) -> None:
    """The default :data:`Say`: one line on stderr, as the CLI says it."""
    print(line, file=sys.stderr)

PROFILE_STEPS = 4  # the first a warm-up: medians over the others' microbatches, per stage and pass
COSTS_STEER = "--costs steers --schedule zb-auto's plan"


def given_costs(schedule: str, csv: Optional[Path], costs: Optional[str], comm: Optional[float]) -> Optional[Costs]:
    """``--costs``/``--comm`` as Costs (None: not given), refused in one line where nothing
    would plan with them: a CSV (already planned), ``auto`` (it measures), another schedule
    (train builds it without costs), ``--comm`` alone (measured costs bring their own delay)."""
    if costs is None:
        if comm is not None:
            raise ConfigError(f"--comm {comm:g} goes with --costs F,B,W (zb-auto's measured costs bring their own "
                              "delay per message)")
        return None
    name = schedule.strip().lower()
    if csv is not None:
        raise ConfigError(f"--costs with --csv: {csv} is already planned; {COSTS_STEER}")
    if name == "auto":
        raise ConfigError(f"--costs with --schedule auto: auto measures the costs for the advisor; {COSTS_STEER}")
    if name != "zb-auto":
        shown = "none (no pipeline)" if name == "none" else get_family(name).name  # an unknown name fails here
        raise ConfigError(f"--costs with --schedule {shown}: train builds it without costs; {COSTS_STEER}")
    return Costs.parse(costs, comm=comm if comm is not None else 0.0)


def chunks_for_model(chunks: Optional[int], ranks: int, num_blocks: int) -> Optional[int]:
    """zb-auto's chunks for a model of ``num_blocks`` blocks: as given, or searched (None) where
    every chunk count it searches fits; else the one chunk per rank every model of at least
    ``ranks`` blocks takes (each stage needs a block: the 6-block GPT on 4 ranks has no V)."""
    family = get_family("zb-auto")
    if chunks is not None or num_blocks >= family.max_chunks * ranks:
        return chunks
    return family.min_chunks


def wants_profile(given: Optional[Costs], limit: Optional[float], limit_bytes: Optional[float],
                  recompute_input: Optional[float]) -> bool:
    """Whether zb-auto's plan needs a profile: for the costs (not given, not under torchrun), or
    for the sizes (a byte limit; a limit whose recompute share is not given)."""
    from .runtime.launching.launch import under_torchrun

    return _wants_sizes(limit, limit_bytes, recompute_input) or (given is None and not under_torchrun())


def _wants_sizes(limit: Optional[float], limit_bytes: Optional[float], recompute_input: Optional[float]) -> bool:
    """A byte limit needs the bytes of one M_B; a limit without ``--recompute-input`` the share."""
    return limit_bytes is not None or (limit is not None and recompute_input is None)


def zb_auto_profile(model: str, ranks: int, microbatches: int, batch_size: int, seed: int, dtype: str,
                    timeout_s: float = DEFAULT_TIMEOUT_S) -> "Profile":
    """The profile zb-auto plans from: the run's model, ranks, microbatches, one replica's batch,
    dtype and timeout."""
    from .training.profile import profile

    return profile(model, ranks, microbatches, batch_size, steps=PROFILE_STEPS, seed=seed, dtype=dtype,
                   timeout_s=timeout_s)


@dataclass(frozen=True)
class ZbAutoInputs:
    """What train's zb-auto plans with: costs (measured or not), memory limit in M_B, the share
    a recomputed stage keeps."""

    costs: Costs
    measured: bool
    memory_limit: Optional[float]
    recompute_input: Optional[float]

    def plan(self, ranks: int, microbatches: int, chunks: Optional[int], say: Say = on_stderr) -> Schedule:
        """zb-auto for these costs. With measured costs, also zb-auto for unit costs (what train
        planned before it measured), keeping whichever the measured costs rank first, the
        measured plan on a tie: zb-auto's search is a heuristic whose candidates depend on the
        costs, and planned for the mlp's measured costs on 4 ranks at a limit of 1 M_B it found an
        order 1.2x slower under those costs than the one it found for unit costs (benchmarks/RESULTS.md)."""
        def build(costs: Costs) -> Schedule:
            return build_schedule("zb-auto", ranks, microbatches, chunks, costs, memory_limit=self.memory_limit,
                                  recompute_input=self.recompute_input)

        plan = build(self.costs)
        if not self.measured:
            return plan
        unit = build(UNIT)
        kept, _ = best_schedule([plan, unit], self.costs, plan.meta["memory_limit"], plan.meta["objective"])
        if kept is unit:
            times = [simulate(s, self.costs).makespan for s in (unit, plan)]
            say(f"zb-auto: the plan for unit costs is faster under the measured costs ({times[0]:.4g} ms "
                f"simulated, against {times[1]:.4g} ms for the plan searched with them): kept it")
        return kept


def zb_auto_inputs(prof: Optional["Profile"], given: Optional[Costs], limit: Optional[float],
                   limit_bytes: Optional[float], recompute_input: Optional[float], say: Say = on_stderr) -> ZbAutoInputs:
    """What zb-auto plans with, each said on stderr.

    Costs: ``given``, else the profile's (:meth:`Profile.costs`: per pass the mean over stages,
    and each stage's F+I+W over that mean as its stage factor, which the planner's cost model
    takes; a stage's own mix of F, I and W it cannot take), else unit costs (under torchrun)."""
    if _wants_sizes(limit, limit_bytes, recompute_input):
        limit, recompute_input = _measured_limit(prof, limit, limit_bytes, recompute_input, say)
    measured = given is None and prof is not None
    costs = given if given is not None else prof.costs() if measured else UNIT
    say(_costs_line(costs, given is not None, measured))
    return ZbAutoInputs(costs, measured, limit, recompute_input)


def _costs_line(costs: Costs, given: bool, measured: bool) -> str:
    if given:
        return f"zb-auto: planned with --costs F {costs.F:g}, I {costs.B:g}, W {costs.W:g}, comm {costs.comm:g}"
    if not measured:
        return ("zb-auto: planned with unit costs (F = I = W = 1, comm 0): under torchrun no profile runs; "
                "--costs F,B,W --comm C plans with yours")
    factors = ", ".join(f"{x:.2f}" for x in costs.stage_multipliers or ())
    return (f"zb-auto: planned with measured costs F {costs.F:.3g} ms, I {costs.B:.3g} ms, W {costs.W:.3g} ms, "
            f"comm {costs.comm:.3g} ms, stage overhead {costs.stage_overhead:.3g} ms, stage factors {factors} (profile of {PROFILE_STEPS} steps, the first a "
            "warm-up; --costs 1,1,1 plans with unit costs and no profile)")


def _measured_limit(prof: "Profile", limit: Optional[float], limit_bytes: Optional[float],
                    recompute_input: Optional[float], say: Say) -> tuple[float, Optional[float]]:
    """zb-auto's limit in M_B and what a recomputed stage keeps, from the profile's sizes
    (``--recompute-input``, if given, overrides the measured share); said on stderr."""
    from .memory import format_bytes

    unit = prof.bytes_per_unit()
    if limit_bytes is not None:
        limit = limit_bytes / unit
    measured = prof.memory_sizes().recompute_share()
    share = recompute_input if recompute_input is not None else (measured if measured < 1 else None)
    say(
        f"zb-auto: one microbatch's activations on the fullest stage measured {format_bytes(unit)}: "
        f"memory limit {limit:.4g} M_B; a recomputed stage keeps {measured:.3g} of its activations"
        + (f" (--recompute-input {share:g} used instead)" if recompute_input is not None else "")
        + ("" if share is not None else ": recomputing would save nothing, not searched"))
    return limit, share
