"""The Perfetto / Chrome trace: the trace-event format, one event per action, paired flows."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

import pipesched
from pipesched.actions import Action
from pipesched.execution import Span
from pipesched.render.timeline import Timeline
from pipesched.render.trace import trace_events, trace_json

COSTS = pipesched.Costs(F=1, B=1.4, W=0.6, comm=0.25)


def check_trace_format(trace: dict) -> None:
    """What chrome://tracing and Perfetto need from the object form of the trace-event format."""
    assert isinstance(trace["traceEvents"], list)
    for e in trace["traceEvents"]:
        assert e["ph"] in {"X", "M", "C", "s", "f"}, e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] == "X":
            for key in ("ts", "dur", "tid"):
                assert key in e, (key, e)
            assert e["dur"] >= 0 and e["ts"] >= 0
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
        if e["ph"] in "sf":
            assert "id" in e and "ts" in e and "tid" in e


def expected_cross_rank_inputs(schedule: pipesched.Schedule) -> int:
    """Counted from the dependency rules directly: inputs produced on another rank."""
    place, last = schedule.placement, schedule.stages - 1
    count = 0
    for _rank, a in schedule.actions():
        if a.kind == "F" and a.stage > 0:
            count += place[a.stage - 1] != place[a.stage]
        elif a.kind in "IB" and a.stage < last:
            count += place[a.stage + 1] != place[a.stage]
    return count


@pytest.mark.parametrize("name", ["1f1b", "interleaved-1f1b", "zb-v", "zb-h1"])
def test_trace_matches_the_schedule(name):
    schedule = pipesched.build_schedule(name, 4, 8)
    result = pipesched.simulate(schedule, COSTS)
    trace = json.loads(trace_json(result))
    check_trace_format(trace)
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(schedule)
    for rank in range(schedule.ranks):
        names = [e["name"] for e in complete if e["pid"] == rank]
        assert names == [str(a) for a in schedule.rank_actions(rank)]
    process_names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert process_names == {r: f"rank {r}" for r in range(schedule.ranks)}
    counters = Counter(e["pid"] for e in events if e["ph"] == "C")
    assert counters == {r: len(result.memory_curve(r)) for r in range(schedule.ranks)}


@pytest.mark.parametrize("name", ["1f1b", "interleaved-1f1b", "zb-v"])
def test_flows_pair_up_across_ranks_and_respect_causality(name):
    schedule = pipesched.build_schedule(name, 4, 8)
    trace = trace_events(pipesched.simulate(schedule, COSTS))
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    by_id = defaultdict(dict)
    for e in trace["traceEvents"]:
        if e["ph"] in "sf":
            assert e["ph"] not in by_id[e["id"]], "one start and one finish per flow id"
            by_id[e["id"]][e["ph"]] = e
    assert len(by_id) == expected_cross_rank_inputs(schedule)

    def enclosing(e):
        return [x for x in slices if x["pid"] == e["pid"] and x["ts"] <= e["ts"] <= x["ts"] + x["dur"]]

    for flow in by_id.values():
        start, finish = flow["s"], flow["f"]
        assert start["pid"] != finish["pid"]
        assert finish["bp"] == "e"
        producer, consumer = enclosing(start)[0], enclosing(finish)[0]
        lag = consumer["ts"] - (producer["ts"] + producer["dur"])
        assert lag >= COSTS.comm * 1000 - 1e-3  # the input arrives comm after it was produced


def test_time_unit_scales_every_timestamp():
    result = pipesched.simulate(pipesched.build_schedule("zb-v", 2, 4), COSTS)
    ms = [e for e in trace_events(result, 1000)["traceEvents"] if e["ph"] == "X"]
    sec = [e for e in trace_events(result, 1e6)["traceEvents"] if e["ph"] == "X"]
    assert [e["ts"] * 1000 for e in ms] == pytest.approx([e["ts"] for e in sec])
    assert [e["dur"] * 1000 for e in ms] == pytest.approx([e["dur"] for e in sec])


def test_measured_timeline_without_memory_or_schedule():
    """What the runtime will pass: spans in seconds, the placement, no memory curve."""
    spans = (
        (Span(Action(0, "F", 0), 0.0, 0.010), Span(Action(0, "B", 0), 0.031, 0.050)),
        (Span(Action(1, "F", 0), 0.012, 0.020), Span(Action(1, "B", 0), 0.020, 0.030)),
    )
    trace = trace_events(Timeline(spans, placement=(0, 1), name="measured", unit="s"), time_unit_us=1e6)
    check_trace_format(trace)
    events = trace["traceEvents"]
    assert [(e["name"], e["ts"], e["dur"]) for e in events if e["ph"] == "X"] == [
        ("0F0", 0.0, 10000.0), ("0B0", 31000.0, 19000.0), ("1F0", 12000.0, 8000.0), ("1B0", 20000.0, 10000.0)]
    assert not [e for e in events if e["ph"] == "C"]
    assert len([e for e in events if e["ph"] == "s"]) == 2  # 0F0 -> 1F0 and 1B0 -> 0B0


def test_bad_time_unit_is_a_value_error():
    with pytest.raises(ValueError):
        trace_events(pipesched.simulate(pipesched.build_schedule("1f1b", 2, 2)), time_unit_us=0)
