"""The data-parallel dimension in the simulator and the advisor: where each stage's all-reduce
sits on the timeline, what of it is exposed, and ``advise --gpus``."""

from __future__ import annotations

import json

import pytest

import pipesched
from pipesched.advise.estimate import Hardware, TransformerCosts
from pipesched.advise.layout import AllReduceCost, advise_layouts, gradient_sync
from pipesched.advise.transformer import TransformerSpec
from pipesched.registry import get_family

HANDCRAFTED = [get_family(n) for n in ("1f1b", "interleaved-1f1b", "zb-h1", "zb-h2")]


def test_a_ring_all_reduce_costs_latency_per_bucket_and_twice_the_bytes_times_dp_minus_one_over_dp():
    cost = AllReduceCost(replicas=4, bandwidth=10.0, latency=0.5, bucket_bytes=100)
    assert cost.time(250) == pytest.approx(3 * 0.5 + 2 * 3 / 4 * 250 / 10)
    assert AllReduceCost(replicas=1, bandwidth=10.0, latency=0.5).time(250) == 0.0


def test_each_stage_reduces_after_its_last_gradient_action_and_only_the_tail_is_exposed():
    schedule = pipesched.build_schedule("1f1b", 2, 4)
    result = pipesched.simulate(schedule, pipesched.Costs(1, 1, 1))
    cost = AllReduceCost(replicas=2, bandwidth=1.0)  # 1 time unit per byte
    synced = gradient_sync(result.timeline, [2.0, 2.0], cost)
    for rank, spans in enumerate(synced.reduce_spans):
        (stage, start, end), = spans
        last_b = max(s.end for s in result.timeline[rank] if s.action[1] == "B")
        assert (stage, start, end) == (rank, last_b, last_b + 2.0)
    # rank 0 finishes last; rank 1's reduction hid behind rank 0's tail
    assert synced.step_time == pytest.approx(result.makespan + 2.0)
    assert synced.exposed == pytest.approx(2.0)
    after = gradient_sync(result.timeline, [2.0, 2.0], cost, overlap=False)
    assert after.step_time == pytest.approx(synced.step_time)  # one stage per rank: nothing to overlap with


def test_on_a_v_the_first_finished_stage_reduces_while_the_other_still_computes():
    schedule = pipesched.build_schedule("zb-v", 2, 4)
    result = pipesched.simulate(schedule, pipesched.Costs(1, 1, 1))
    cost = AllReduceCost(replicas=2, bandwidth=1.0)
    overlapped = gradient_sync(result.timeline, [3.0] * 4, cost)
    after = gradient_sync(result.timeline, [3.0] * 4, cost, overlap=False)
    assert overlapped.step_time < after.step_time
    assert after.step_time == pytest.approx(result.makespan + 6.0)


def test_the_closing_follows_the_last_reduction_and_is_not_counted_as_exposed_all_reduce():
    schedule = pipesched.build_schedule("zb-v", 2, 4)
    result = pipesched.simulate(schedule, pipesched.Costs(1, 1, 1))
    cost = AllReduceCost(replicas=2, bandwidth=1.0)
    plain = gradient_sync(result.timeline, [3.0] * 4, cost)
    closed = gradient_sync(result.timeline, [3.0] * 4, cost, closing=1.5)
    assert closed.step_time == pytest.approx(plain.step_time + 1.5)
    assert closed.exposed == pytest.approx(plain.exposed)
    assert closed.reduce_spans == plain.reduce_spans


def _model(layers=8, hidden=1024):
    spec = TransformerSpec(layers, hidden, 512, 2, vocab=32000)
    return TransformerCosts(spec, 1, Hardware(bandwidth=50, gpu_memory=40))


def test_layouts_are_ranked_by_step_time_and_each_beats_or_ties_its_own_1f1b():
    advice = advise_layouts(4, _model(), 32, dp_bandwidth=10, families=HANDCRAFTED)
    times = [c.step_time for c in advice.candidates]
    assert times == sorted(times)
    assert {(c.pp, c.dp) for c in advice.candidates} == {(1, 4), (2, 2), (4, 1)}
    for c in advice.candidates:
        assert c.pp * c.dp == 4
        assert c.step_time >= c.candidate.makespan
        assert c.step_time == pytest.approx(c.candidate.makespan + c.exposed_allreduce)
        base = advice.baseline(c.pp, c.dp)
        assert base is not None and min(x.step_time for x in advice.candidates if (x.pp, x.dp) == (c.pp, c.dp)) <= base.step_time
    assert all(c.exposed_allreduce == 0 for c in advice.candidates if c.dp == 1)


def test_a_slower_link_between_replicas_pushes_the_choice_towards_deeper_pipelines():
    fast = advise_layouts(4, _model(), 32, dp_bandwidth=1000, families=HANDCRAFTED).recommended
    slow = advise_layouts(4, _model(), 32, dp_bandwidth=0.1, families=HANDCRAFTED).recommended
    assert slow.pp > fast.pp


def test_cli_gpus_json_entries_carry_pp_and_dp(cli):
    done = cli(
        "advise", "--gpus", "4", "--layers", "8", "--hidden", "1024", "--seq-len", "512", "--vocab", "32000",
        "--microbatch-size", "2", "--global-batch", "32", "--gpu-memory", "40", "--bandwidth", "50",
        "--schedules", "1f1b,zb-h1", "--json",
    )
    assert done.returncode == 0, done.stderr
    entries = json.loads(done.stdout)
    assert entries and all(e["pp"] * e["dp"] == 4 for e in entries)
    assert [e["step_time"] for e in entries] == sorted(e["step_time"] for e in entries)


def test_cli_gpus_report_names_the_chosen_layout(cli, tmp_path):
    report = tmp_path / "layout.html"
    done = cli(
        "advise", "--gpus", "4", "--layers", "8", "--hidden", "1024", "--seq-len", "512",
        "--microbatch-size", "2", "--global-batch", "32", "--gpu-memory", "40", "--bandwidth", "50",
        "--schedules", "1f1b,zb-h1", "--report", str(report),
    )
    assert done.returncode == 0, done.stderr
    html = report.read_text()
    assert "pipeline ranks \u00d7" in html and "<svg" in html


def test_cli_gpus_without_a_global_batch_is_one_line_exit_2(cli):
    done = cli(
        "advise", "--gpus", "4", "--layers", "8", "--hidden", "1024", "--seq-len", "512", "--microbatch-size", "2",
        "--bandwidth", "50",
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["pipesched: error: --gpus needs --global-batch G (samples per step over every replica)"]


def test_every_layout_is_searched_in_full_at_the_user_s_microbatch_size():
    # issue 37: no time budget narrows a layout's search (its microbatch counts or its families)
    searching = [get_family(n) for n in ("1f1b", "zb-h1", "zb-v", "v-min")]
    advice = advise_layouts(4, _model(), 64, dp_bandwidth=10, families=searching)
    assert {a.ranks for a in advice.per_layout} == {1, 2, 4}
    assert all(a.searched == "in full" for a in advice.per_layout)
    for a in advice.per_layout:  # microbatches of 2 (the model's): 64 / dp / 2 of them, no other count
        assert a.plan.options == (64 // (4 // a.ranks) // 2,)
    deepest = {c.candidate.schedule for c in advice.candidates if c.pp == 4}
    assert {"zb-v", "v-min"} & deepest  # the widest searches are kept where they win
    assert all(c.candidate.microbatch_size == 2 for c in advice.candidates)


def test_other_microbatch_counts_only_where_max_microbatches_opens_them():
    advice = advise_layouts(4, _model(), 64, dp_bandwidth=10, families=HANDCRAFTED, max_microbatches=16,
                            min_microbatch_size=1)
    deepest = next(a for a in advice.per_layout if a.ranks == 4)
    assert deepest.plan.options == (1, 2, 4, 8, 16, 32)  # up to 16, and the 32 of the model's size
