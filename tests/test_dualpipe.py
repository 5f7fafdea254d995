"""DualPipe: two model copies fed from opposite ends, as 2p V-placed stages forming two pipelines.

Rank r holds stage r of the forward copy (stages 0..p-1) and stage p-1-r of the reverse copy
(IR stage p + (p-1-r)); the first ceil(m/2) microbatches enter at rank 0, the rest at rank
p-1; the order is DeepSeek's (DualPipeV's program on the folded rank min(r, p-1-r)).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesched import (
    ConfigError,
    Costs,
    CSVFormatError,
    Schedule,
    build_schedule,
    simulate,
    validate,
)
from pipesched.actions import Action, Overlap, sub_actions
from pipesched.simulate import action_durations


@settings(max_examples=20, deadline=None)
@given(half=st.integers(1, 6), m=st.integers(2, 40))
def test_dualpipe_is_valid_for_every_even_p_and_m_at_p_plus_one(half, m):
    p = 2 * half
    schedule = build_schedule("dualpipe", p, m)
    validate(schedule)
    assert (schedule.pipelines, schedule.stages, schedule.chunks, schedule.microbatches) == (2, 2 * p, 2, m)
    result = simulate(schedule)
    # each rank does its share of both copies: m/2 microbatches on 2 stages weighing 1 each
    assert result.busy == pytest.approx([3.0 * m] * p)
    assert result.max_peak_memory <= p + 1 + 1e-9
    if m >= 2 * p:
        assert result.max_peak_memory == pytest.approx(p + 1)  # DualPipe's README: PP + 1


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 7), (6, 20)])
def test_each_copy_runs_its_own_half_of_the_microbatches_from_its_own_end(p, m):
    schedule = build_schedule("dualpipe", p, m)
    first_half = range(0, (m + 1) // 2)
    assert [schedule.placement[s] for s in range(2 * p)] == [*range(p), *reversed(range(p))]
    for stage in range(2 * p):
        ran = sorted(a.microbatch for _, a in schedule.actions() if a.stage == stage and a.kind == "F")
        assert ran == list(first_half if stage < p else range(first_half.stop, m))
    # both ends start at once: each copy's first stage has nothing to wait for
    starts = {span.action: span.start for spans in simulate(schedule).timeline for span in spans}
    assert starts[Action(0, "F", 0)] == starts[Action(p, "F", first_half.stop)] == 0.0


@pytest.mark.parametrize("p,m", [(2, 6), (4, 8), (8, 20)])
def test_rank_r_and_rank_p_minus_1_minus_r_run_mirrored_programs(p, m):
    schedule = build_schedule("dualpipe", p, m)

    def mirrored(a: Action) -> Action:  # the same position in the other copy, on its own microbatches
        return Action((a.stage + p) % (2 * p), a.kind, (a.microbatch + m // 2) % m)

    for r in range(p):
        mirror = [tuple(map(mirrored, sub_actions(e))) for e in schedule.rank_entries(r)]
        assert mirror == [tuple(sub_actions(e)) for e in schedule.rank_entries(p - 1 - r)]


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (6, 12), (8, 16), (8, 40)])
def test_unit_cost_makespan_follows_dualpipe_bubble_formula(p, m):
    # DualPipe's README: bubble (PP/2-1)(F&B + B - 3W), B the full backward; here F=1, B=2, W=1
    # and, with the halves run one after the other (overlap 1), F&B = 3
    result = simulate(build_schedule("dualpipe", p, m))
    assert result.makespan == pytest.approx(3 * m + (p // 2 - 1) * (3 + 2 - 3))


def test_its_steady_state_overlaps_one_copys_forward_with_the_others_backward():
    schedule = build_schedule("dualpipe", 4, 16)
    pairs = [e for r in range(4) for e in schedule.rank_entries(r) if isinstance(e, Overlap)]
    assert pairs and all((e.forward.stage < 4) != (e.backward.stage < 4) for e in pairs)
    assert simulate(schedule, Costs(overlap=0)).makespan < simulate(schedule).makespan


def test_memory_counts_two_copies_of_the_parameters():
    dual, v = simulate(build_schedule("dualpipe", 4, 8)), simulate(build_schedule("dualpipev", 4, 8))
    assert (dual.parameter_copies, v.parameter_copies) == (2, 1)
    assert dual.metrics()["parameter_copies"] == 2


def test_both_copies_of_a_stage_cost_the_same_under_skewed_stage_costs():
    schedule = build_schedule("dualpipe", 4, 8)
    table = action_durations(schedule, Costs(stage_multipliers=(1, 1, 1, 3)))
    assert table[(3, "F")] == table[(7, "F")] == pytest.approx(3.0)  # stage 3 of each copy
    assert table[(0, "F")] == table[(4, "F")] == pytest.approx(1.0)


@pytest.mark.parametrize("p,m", [(2, 3), (4, 8), (6, 13)])
def test_its_csv_reads_back_as_two_pipelines_from_which_microbatches_each_stage_runs(p, m):
    schedule = build_schedule("dualpipe", p, m)
    back = validate(Schedule.from_csv(schedule.to_csv()))
    assert back.pipelines == 2
    assert (back.orders, back.placement, back.microbatches) == (schedule.orders, schedule.placement, m)
    costs = Costs(F=1, B=1.5, W=0.5, comm=0.1)
    assert simulate(back, costs).makespan == simulate(schedule, costs).makespan


def test_a_two_pipeline_csv_whose_stage_runs_another_block_is_refused_naming_what_each_stage_runs():
    # stage 5 (the reverse copy's stage 1) runs microbatch 3, the forward copy's, instead of 7
    rows = [",".join(str(_renumbered(entry)) for entry in build_schedule("dualpipe", 4, 8).rank_entries(r))
            for r in range(4)]
    with pytest.raises(CSVFormatError) as refused:
        Schedule.from_csv("\n".join(rows) + "\n")
    assert ("stages 0-3 run 0-3, stage 4 runs 4-7, stage 5 runs 3-6, stages 6-7 run 4-7"
            in str(refused.value))


def _renumbered(entry):
    def moved(a: Action) -> Action:
        return Action(5, a.kind, 3) if (a.stage, a.microbatch) == (5, 7) else a

    return Overlap(moved(entry.forward), moved(entry.backward)) if isinstance(entry, Overlap) else moved(entry)


@pytest.mark.parametrize("p,m,fragment", [(3, 8, "even number of ranks"), (4, 1, "microbatches >= 2")])
def test_odd_ranks_and_a_single_microbatch_are_refused(p, m, fragment):
    with pytest.raises(ConfigError, match=fragment):
        build_schedule("dualpipe", p, m)


def test_the_runtime_builds_each_rank_one_stage_of_each_copy_fed_from_both_ends():
    pytest.importorskip("torch")
    from pipesched.balance import balanced_counts
    from pipesched.runtime.stages.copies import (
        ModelCopies,
        balanced_block_counts,
        input_ranks,
        loss_ranks,
    )

    schedule = build_schedule("dualpipe", 4, 8)
    copies = ModelCopies(schedule)
    assert [copies.model_stage(s) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert input_ranks(schedule) == loss_ranks(schedule) == {0, 3}
    # rank r and rank 3-r hold the two copies of model stages r and 3-r: they sum their gradients
    assert copies.copy_groups() == [(0, 3), (1, 2)]
    # rank r runs model stages r and 3-r on half the microbatches each: balance the pairs'
    # blocks, one count per stage of one model copy
    costs = [2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0]
    assert balanced_block_counts(costs, schedule) == balanced_counts(costs, (0, 1, 1, 0))
    assert len(balanced_block_counts(costs, schedule)) == 4
    assert ModelCopies(build_schedule("zb-v", 2, 4)).copy_groups() == []


def late_finishing_copy(schedule: Schedule) -> Schedule:
    """``schedule`` (dualpipe, 2 ranks, m=4) as a CSV whose rank 1 finishes its model stages in
    the other order than rank 0: its last full backward of model stage 1 moved to the end."""
    lines = schedule.to_csv().splitlines()
    assert lines[1].endswith(",1B1,2I3,2W3")
    lines[1] = lines[1].replace(",1B1,2I3,2W3", ",2I3,2W3,1B1")
    return validate(Schedule.from_csv("\n".join(lines) + "\n", name="late copy"))


def test_a_rank_starts_summing_a_stage_with_its_copy_when_both_ranks_finish_stages_in_one_order():
    pytest.importorskip("torch")
    from pipesched.ops import Op
    from pipesched.runtime.comm.reduction import item_layouts, overlappable
    from pipesched.runtime.program.program import lower
    from pipesched.runtime.stages.copies import ModelCopies
    from pipesched.runtime.stages.partition import stage_block_ranges

    def copies_finish_in_step(schedule) -> bool:
        layouts = item_layouts(schedule, ModelCopies(schedule).stage_ranges(stage_block_ranges(8, schedule.ranks)), ())
        return all(overlappable(layouts, lay.holders) for lay in layouts)

    for p, m in [(2, 2), (2, 4), (4, 8), (6, 12), (8, 20)]:
        assert copies_finish_in_step(build_schedule("dualpipe", p, m)), (p, m)
    dual = build_schedule("dualpipe", 2, 4)
    # rank 0 is done with model stage 1 (its reverse copy's stage 3) before model stage 0
    code = lower(dual, 0).instructions
    assert [i.stage for i in code if i.op is Op.REDUCE_GRAD] == [3, 0]
    assert [i.op for i in code if i.op is not Op.RESHARD][-3:] == [Op.I, Op.W, Op.REDUCE_GRAD]
    # a CSV whose two ranks finish model stages 0 and 1 in opposite orders would pair rank 0's
    # sum of stage 1 with rank 1's of stage 0: its sums wait for the step's end
    assert not copies_finish_in_step(late_finishing_copy(dual))


@pytest.mark.parametrize("p", [2, 4])
def test_each_copys_messages_flow_its_own_way_and_the_trace_draws_every_one(p):
    from pipesched.ops import SENDS
    from pipesched.render.timeline import Timeline
    from pipesched.render.trace import cross_rank_edges
    from pipesched.runtime.program.instructions import ACT
    from pipesched.runtime.program.program import lower

    schedule = build_schedule("dualpipe", p, 2 * p)
    messages = [i.message for r in range(p) for i in lower(schedule, r).instructions if i.op in SENDS]
    for msg in messages:
        forward_copy = msg.stage < p
        downstream = (msg.dst == msg.src + 1) == (msg.kind == ACT)
        assert downstream == forward_copy, msg  # the reverse copy's activations go to rank r-1
    timeline = Timeline.from_sim(simulate(schedule))
    assert len(cross_rank_edges(timeline)) == len(messages)


def test_the_drawings_name_the_two_pipelines_in_the_legend():
    from pipesched.render.layout import build_chart
    from pipesched.render.timeline import Timeline

    legend = [words for _x, _key, words in build_chart(Timeline.from_sim(simulate(build_schedule("dualpipe", 4, 8)))).legend]
    assert "F forward (pipeline 0 from rank 0)" in legend and "F forward (pipeline 1 from rank 3)" in legend
    assert not any("chunk" in words for words in legend)


def test_torchtitan_settings_are_refused_naming_why():
    from pipesched.interop.torchtitan import torchtitan_schedule_name

    with pytest.raises(ConfigError, match="2 model copies"):
        torchtitan_schedule_name(build_schedule("dualpipe", 4, 8))


def test_activation_bytes_weigh_each_copys_stage_as_a_whole_share(cli):
    import json

    done = cli("simulate", "dualpipe", "-p", "4", "-m", "8", "--activation-bytes", "1GiB", "--json")
    assert done.returncode == 0, done.stderr
    metrics = json.loads(done.stdout)
    assert metrics["peak_memory_bytes"] == [peak * 2**30 for peak in metrics["peak_memory"]]


def test_recompute_names_the_models_stages_and_recomputes_them_in_both_copies(cli):
    import json

    from pipesched.memory import recompute_stages

    schedule = build_schedule("dualpipe", 4, 8)
    assert recompute_stages("1", schedule) == {1, 5}  # model stage 1: rank 1's forward copy, rank 2's reverse one
    assert recompute_stages("all", schedule) == set(range(8))
    with pytest.raises(ConfigError, match="stage 5, but the model has stages 0 to 3"):
        recompute_stages("5", schedule)

    def simulated(*recompute):
        done = cli("simulate", "dualpipe", "-p", "4", "-m", "8", "--activation-bytes", "1GiB,1GiB,64MiB", *recompute, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    plain, first = simulated(), simulated("--recompute", "0")
    assert first["recompute"] == [0]
    lighter = [r for r in range(4) if first["peak_memory_bytes"][r] < plain["peak_memory_bytes"][r]]
    assert lighter == [0, 3]  # the ranks that hold a copy of model stage 0
