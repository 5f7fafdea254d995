"""The memory rules (pipesched.memory): what each action takes and frees, in M_B or in bytes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipesched
from conftest import run_cli
from pipesched.actions import Action
from pipesched.memory import MemorySizes, StageMemory, level_after, levels, parse_size, peak, rank_peaks, unit_peak

SPLIT = ("zb-h1", "zb-h2", "zb-v", "v-half", "v-min")


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b", *SPLIT]), st.integers(2, 4), st.integers(1, 10))
def test_bytes_with_every_stage_one_unit_and_nothing_freed_by_i_are_the_m_b_counts(name, ranks, m):
    schedule = pipesched.build_schedule(name, ranks, max(m, ranks))
    stages_per_rank = schedule.stages // ranks
    share = MemorySizes((StageMemory(1.0, 1.0),) * schedule.stages, (0.0,) * schedule.stages)
    result = pipesched.simulate(schedule, memory=share)
    assert [x / stages_per_rank for x in result.peak_memory_bytes] == pytest.approx(list(result.peak_memory))


def test_i_frees_all_but_the_stash_and_w_frees_the_stash():
    actions = [Action.parse(a) for a in ("0F0", "0F1", "0I0", "0F2", "0W0", "0I1", "0I2", "0W1", "0W2")]
    stored = [StageMemory(keep=10, stash=10)]
    lean = [StageMemory(keep=10, stash=4)]
    assert peak(actions, stored) == 10 * unit_peak(actions, 1) == 30
    assert levels(actions, lean)[2].tolist() == [10, 20, 14, 24, 20, 14, 8, 4, 0]
    assert peak(actions, lean) == 24


def test_a_recomputed_stage_keeps_its_input_and_rebuilds_the_rest_in_its_backward():
    schedule = pipesched.build_schedule("gpipe", 2, 8)
    sizes = MemorySizes((StageMemory(100, 100),) * 2, (5.0, 5.0))
    plain = pipesched.simulate(schedule, memory=sizes)
    recomputed = pipesched.simulate(schedule, memory=sizes.with_recompute({0, 1}))
    assert plain.peak_memory_bytes == (800, 800)
    assert recomputed.peak_memory_bytes == (8 * 5 + 95, 8 * 5 + 95)  # inputs, plus one stage rebuilt
    assert recomputed.peak_memory == plain.peak_memory  # M_B counts stored activations: unchanged
    costs = pipesched.Costs(F=1, B=2, W=1)
    # 8 forwards and the last stage's 8 backwards, then rank 0's last: each backward one F longer
    assert pipesched.simulate(schedule, costs).makespan == 1 + 8 + 8 * 3 + 3
    assert pipesched.simulate(schedule, costs, sizes.with_recompute({0, 1})).makespan == 1 + 8 + 8 * 4 + 4


def test_a_stage_recomputed_block_by_block_keeps_its_blocks_inputs_and_rebuilds_one_block_at_a_time():
    schedule = pipesched.build_schedule("gpipe", 2, 8)
    sizes = MemorySizes((StageMemory(100, 100),) * 2, (5.0, 5.0), blocks=(4, 4)).with_recompute({0, 1})
    # 8 microbatches' 4 block inputs, plus one block of 25 rebuilt less its input
    assert pipesched.simulate(schedule, memory=sizes).peak_memory_bytes == (8 * 4 * 5 + 20, 8 * 4 * 5 + 20)


def test_under_a_split_backward_recomputation_leaves_the_w_stash_whole():
    actions = [Action.parse(a) for a in ("0F0", "0F1", "0I0", "0W0", "0I1", "0W1")]
    (recomputed,) = MemorySizes((StageMemory(100, 80),), (5.0,), frozenset({0}), (4,)).effective()
    # I rebuilds a block (+20) after the 3 others left their stash (20 each) for their input (5)
    _, high, after = levels(actions, [recomputed])
    assert list(zip(high.tolist(), after.tolist())) == [
        (20, 20), (40, 40), (40 + 20 + 3 * 15, 40 - 20 + 80), (100, 20), (20 + 65, 80), (80, 0)]
    assert peak(actions, [StageMemory(100, 80)]) == 200


def test_memory_curve_in_bytes_ends_where_it_started():
    schedule = pipesched.build_schedule("zb-v", 2, 4)
    sizes = MemorySizes((StageMemory(8, 6, 1),) * 4, (2.0,) * 4)
    result = pipesched.simulate(schedule, memory=sizes)
    for rank in range(2):
        curve = result.memory_curve(rank, in_bytes=True)
        assert curve[-1][1] == 0 and max(level for _, level in curve) == result.peak_memory_bytes[rank]


def _curve_pass_by_pass(result, rank):
    """The memory curve's definition, one pass at a time: a forward steps to the level after it
    at its start; another pass first rises to its highest at its start (where that is above the
    level so far: a recomputed backward), then steps to the level after it at its end, unless it
    is an I that leaves the level as it was; levels floored at 0."""
    spans = result.timeline[rank]
    _, high, after = levels([s.action for s in spans], result.memory.effective())
    curve = [(0.0, 0.0)]
    for span, top, level in zip(spans, high.tolist(), after.tolist()):
        if span.action.kind == "F":
            curve.append((span.start, max(level, 0.0)))
            continue
        if top > curve[-1][1]:
            curve.append((span.start, top))
        if span.action.kind != "I" or level != curve[-1][1]:
            curve.append((span.end, max(level, 0.0)))
    return curve


@pytest.mark.parametrize("name, chunks, recompute", [
    ("1f1b", None, frozenset()), ("zb-h1", None, frozenset({1})), ("zb-v", None, frozenset({0, 3, 5})),
    ("interleaved-zb", 2, frozenset(range(8))), ("v-min", None, frozenset()), ("dualpipev", None, frozenset({2})),
])
def test_the_memory_curve_by_arrays_is_the_pass_by_pass_curve_to_the_bit(name, chunks, recompute):
    schedule = pipesched.build_schedule(name, 4, 8, chunks)
    stages = schedule.stages
    sizes = MemorySizes(tuple(StageMemory(8.0 + s, 6.0 + 0.5 * s, 1.0) for s in range(stages)), (2.0,) * stages,
                        recompute, (3,) * stages)
    result = pipesched.simulate(schedule, pipesched.Costs(1, 1.3, 0.7, comm=0.1), memory=sizes)
    for rank in range(schedule.ranks):
        assert result.memory_curve(rank, in_bytes=True) == _curve_pass_by_pass(result, rank)


@pytest.mark.parametrize("text,value", [("40GiB", 40 * 2**30), ("512MiB", 512 * 2**20), ("1.5GB", 1.5e9),
                                        ("100 B", 100), ("3", None), ("2.5", None)])
def test_sizes_carry_a_unit_and_plain_numbers_are_m_b(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["40XB", "GiB", "lots"])
def test_bad_sizes_name_the_valid_units(text):
    with pytest.raises(ValueError, match="GiB"):
        parse_size(text)


@pytest.mark.parametrize("args,fragment", [
    (["simulate", "1f1b", "--memory-limit", "40GiB"], "--memory-limit takes M_B units"),
    (["simulate", "1f1b", "--memory-limit", "40XB"], "unknown unit 'XB'"),
    (["advise", "--layers", "8", "--hidden", "256", "--seq-len", "64", "--microbatch-size", "1",
      "--memory-limit", "12parsecs"], "unknown unit"),
    (["advise", "--layers", "8", "--hidden", "256", "--seq-len", "64", "--microbatch-size", "1",
      "--attention", "linear"], "--attention 'linear'"),
])
def test_bad_memory_limits_are_one_line_and_exit_2(args, fragment):
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesched: error:") and fragment in lines[0]


def test_advise_takes_a_byte_limit_with_a_model_description():
    # a limit in bytes counts the whole footprint: each rank's 4 layers' weights, gradients and
    # optimizer state take 48.2 MiB, so 51.2MiB leaves 3 MiB for activations
    result = run_cli("advise", "--ranks", "2", "--layers", "8", "--hidden", "256", "--seq-len", "64",
                     "--microbatch-size", "1", "--microbatches", "4", "--rank-memory-limit", "51.2MiB",
                     "--schedules", "1f1b,gpipe,zb-v", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    # a rank's 4 layers stored are 4.2 MB: a leaner zb-v, or recomputing, fits; stored 1f1b does not
    assert rows[0]["fits"] and rows[0]["schedule"] == "zb-v" and rows[0]["recompute"] == "none"
    fits = {(r["schedule"], r["recompute"]): r["fits"] for r in rows}
    assert fits[("1f1b", "all")] and not fits[("1f1b", "none")]
    too_little = run_cli("advise", "--ranks", "2", "--layers", "8", "--hidden", "256", "--seq-len", "64",
                         "--microbatch-size", "1", "--microbatches", "4", "--rank-memory-limit", "48.7MiB",
                         "--schedules", "1f1b,gpipe,zb-v")
    assert too_little.returncode == 2
    assert "no schedule fits in the memory limit: the leanest, " in too_little.stderr
    # two microbatches' 4 layer inputs and one layer rebuilt
    assert "recompute all), needs 48.9 MiB (0.0513 GB) on its fullest rank" in too_little.stderr
    assert "with 737 KiB of activations" in too_little.stderr


def test_simulate_reports_peak_bytes_when_the_activation_size_is_given():
    result = run_cli("simulate", "zb-v", "-p", "4", "-m", "8", "--activation-bytes", "1GiB,512MiB,64MiB", "--json")
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout)
    assert metrics["peak_memory"] == [4.0] * 4  # M_B unchanged
    assert metrics["peak_memory_bytes"] == [4 * 2**30] * 4  # 4 forwards in flight before any I frees
    recomputed = json.loads(run_cli("simulate", "zb-v", "-p", "4", "-m", "8", "--activation-bytes",
                                    "1GiB,512MiB,64MiB", "--recompute", "all", "--json").stdout)
    assert max(recomputed["peak_memory_bytes"]) < max(metrics["peak_memory_bytes"])
    assert recomputed["makespan"] > metrics["makespan"]
    limited = run_cli("simulate", "zb-auto", "-p", "4", "-m", "8", "--activation-bytes", "1GiB",
                      "--activation-limit", "2GiB", "--json")
    assert json.loads(limited.stdout)["peak_memory"] == [2.0] * 4  # 2GiB over 1GiB per M_B


@pytest.mark.parametrize("name, chunks", [("interleaved-zb", 2), ("dualpipev", 2)])
def test_every_ranks_peak_is_its_held_amount_summed_action_by_action(name, chunks):
    # the arrays (one running sum per rank) against the rule read one action at a time: held
    # grows by each action's change, and a backward holds its extra above the level at its start;
    # the same additions in the same order, so the same floats
    schedule = pipesched.build_schedule(name, 4, 8, chunks)
    sizes = MemorySizes(tuple(StageMemory(1e9 + 3e7 * s, 4e8 + 1e7 * s, 2e7 * (s % 2)) for s in range(schedule.stages)),
                        (5e7,) * schedule.stages, frozenset({0, 3}), (2,) * schedule.stages).effective()
    program = schedule.program
    for ids, got in zip(program.rank_ids, rank_peaks(program.stage, program.kind, program.rank_ids, sizes)):
        held, highest = 0.0, 0.0
        for stage, kind, _k in program.actions[ids.start:ids.stop]:
            extra = sizes[stage].extra_during(kind) if kind.is_backward else 0.0
            during, held = held + extra, held + level_after(kind, sizes[stage])
            highest = max(highest, during, held)
        assert got == highest
