"""The search's memoized builds give what building again from scratch gives (issue 37).

A search asks for the same construction several times (zb-v, v-half and v-min share one pool of V
programs; zb-auto seeds itself with the families just built; a schedule is simulated by its
builder and again by the advisor): the programs are kept (``lru_cache``) and a schedule keeps
its runs (``Schedule.derived``). Nothing is approximated, so the schedules and their metrics
must be equal exactly, not within a tolerance."""

from pipesched.advise.candidates import batch_plan, settings
from pipesched.advise.evaluate import evaluate
from pipesched.advise.costmodel import ScaledCosts
from pipesched.costs import Costs
from pipesched.registry import build_schedule, forget_builds, get_family
from pipesched.schedule import Schedule
from pipesched.schedules import v_compact
from pipesched.simulate import simulate

SKEWED = Costs(F=1.0, B=1.3, W=0.7, comm=0.05)  # unequal costs: the V families search their pool
P, M = 4, 24


def _metrics(candidates) -> list[tuple]:
    return [(c.schedule, c.chunks, c.recompute, c.makespan, c.span, c.bubble_ratio, c.peak_per_rank, c.fits)
            for c in candidates]


def test_a_search_s_candidates_equal_those_of_settings_built_each_from_scratch():
    families = [get_family(n) for n in ("zb-v", "v-half", "v-min")]  # (zb-auto's MILP stops on time: not reproducible)
    plan = batch_plan(P, M)
    model = ScaledCosts(SKEWED, P / 2)  # a limit below 1F1B's: the V families steer to it
    forget_builds()
    together = [_metrics(evaluate(s, P, plan, model, "makespan")) for s in settings(families, plan, 2)]
    assert v_compact.compacted_orders.cache_info().hits > 0  # the families did share the compacted programs
    alone = []
    for s in settings(families, plan, 2):
        forget_builds()
        alone.append(_metrics(evaluate(s, P, plan, model, "makespan")))
    assert together == alone


def test_a_schedule_simulated_again_equals_a_fresh_copy_simulated_once():
    schedule = build_schedule("zb-v", P, M, 2, SKEWED, P / 2)
    first, again = simulate(schedule, SKEWED), simulate(schedule, SKEWED)  # the second reuses the run
    fresh = simulate(Schedule(schedule.ranks, schedule.microbatches, schedule.placement, schedule.orders), SKEWED)
    for result in (again, fresh):
        assert (result.makespan, result.span, result.bubble_ratio, result.peak_memory, result.busy) == (
            first.makespan, first.span, first.bubble_ratio, first.peak_memory, first.busy)
        assert result.timeline == first.timeline
    other = simulate(schedule, Costs(F=1.0, B=2.0, W=1.0))  # other costs: their own run
    assert other.makespan != first.makespan


def test_zb_auto_after_the_v_families_equals_zb_auto_from_scratch():
    """zb-auto's V seeds (the handcrafted programs, the greedy's) are the V family's schedules,
    with the runs simulating them there: the same pick, orders and origin as built alone. At
    ``p * m`` above the exact refinement's size (its MILP stops on time: not reproducible)."""
    p, m, limit = 4, 66, 3.0
    forget_builds()
    for name in ("zb-v", "v-half", "v-min"):
        build_schedule(name, p, m, 2, SKEWED, limit)
    shared = [build_schedule("zb-auto", p, m, chunks, SKEWED, limit) for chunks in (2, 1)]
    for chunks, schedule in zip((2, 1), shared):
        forget_builds()
        alone = build_schedule("zb-auto", p, m, chunks, SKEWED, limit)
        assert (schedule.orders, schedule.meta["origin"]) == (alone.orders, alone.meta["origin"])
