"""Chrome / Perfetto trace-event JSON from a timeline (simulated or measured).

One process per rank (named ``rank R``, compute on thread 0), one complete event (``ph: "X"``)
per action named by its action string (``2F0``), a ``memory`` counter per rank, and a flow
arrow (``ph: "s"`` then ``"f"``, sharing an id) for every input that crosses ranks, from the
producing action to the consuming one.

Times: trace events count microseconds. ``time_unit_us`` says how many microseconds one unit of
the timeline is: the default 1000 shows one simulator cost unit as 1 ms (comfortable zoom levels
in Perfetto); a runtime timeline measured in seconds passes ``1e6``.
"""

from __future__ import annotations

from typing import Union

from ..jsontext import json_text
from ..dependencies import dependency, produced
from ..ops import Op
from ..simulate import SimResult
from .timeline import Timeline, as_timeline

DEFAULT_UNIT_US = 1000.0
CATEGORY = {Op.F: "forward", Op.I: "backward_input", Op.W: "backward_weight", Op.B: "backward"}
COMPUTE_TID = 0


def trace_events(source: Union[SimResult, Timeline], time_unit_us: float = DEFAULT_UNIT_US) -> dict:
    """The trace as a JSON-ready object: ``{"traceEvents": [...], "displayTimeUnit": "ms", ...}``."""
    if not time_unit_us > 0:
        raise ValueError(f"time_unit_us must be above 0, got {time_unit_us!r}")
    timeline = as_timeline(source)
    chunk = timeline.chunk_of_stage()
    events: list[dict] = []
    for rank in range(timeline.ranks):
        events.append(_meta("process_name", rank, {"name": f"rank {rank}"}))
        events.append(_meta("process_sort_index", rank, {"sort_index": rank}))
        events.append({**_meta("thread_name", rank, {"name": "compute"}), "tid": COMPUTE_TID})
    for rank, spans in enumerate(timeline.spans):
        for action, start, end in spans:
            events.append({
                "name": str(action), "cat": CATEGORY[action.kind], "ph": "X",
                "ts": _us(start, time_unit_us), "dur": _us(end - start, time_unit_us),
                "pid": rank, "tid": COMPUTE_TID,
                "args": {"stage": action.stage, "microbatch": action.microbatch,
                         "kind": action.kind, "chunk": chunk[action.stage]},
            })
    events.extend(_flows(timeline, time_unit_us))
    if timeline.memory is not None:
        for rank, curve in enumerate(timeline.memory):
            for time, level in curve:
                events.append({"name": "memory", "ph": "C", "ts": _us(time, time_unit_us),
                               "pid": rank, "args": {f"activations ({timeline.memory_unit})": level}})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"schedule": timeline.name, "time_unit_us": time_unit_us, "unit": timeline.unit},
    }


def trace_json(source: Union[SimResult, Timeline], time_unit_us: float = DEFAULT_UNIT_US) -> str:
    """The trace as JSON text, ready for ui.perfetto.dev or chrome://tracing."""
    return json_text(trace_events(source, time_unit_us), separators=(",", ":"))


def cross_rank_edges(timeline: Timeline) -> list[tuple[int, int, int, int]]:
    """Every input that crosses ranks as (producer rank, producer index, consumer rank, consumer
    index), indices into ``timeline.spans[rank]``."""
    stages, pipelines = len(timeline.placement), timeline.pipelines
    made_at = {produced(action): (rank, index)
               for rank, spans in enumerate(timeline.spans) for index, (action, _start, _end) in enumerate(spans)}
    edges = []
    for rank, spans in enumerate(timeline.spans):
        for index, (action, _start, _end) in enumerate(spans):
            needed = dependency(action, stages, pipelines)
            source = made_at.get(needed) if needed is not None else None
            if source is not None and source[0] != rank:
                edges.append((source[0], source[1], rank, index))
    return edges


def _flows(timeline: Timeline, unit_us: float) -> list[dict]:
    """Flow start inside the producer's slice, end bound to the consumer's slice (``bp: "e"``).

    Perfetto draws the arrow from the producer's end to the consumer's start; both timestamps
    sit 1 us inside the slices so they bind to them whatever the sort order of equal times.
    """
    flows = []
    for flow_id, (src_rank, src, dst_rank, dst) in enumerate(cross_rank_edges(timeline), start=1):
        _, s_start, s_end = timeline.spans[src_rank][src]
        action, d_start, d_end = timeline.spans[dst_rank][dst]
        s_ts = max(_us(s_start, unit_us), _us(s_end, unit_us) - 1)
        d_ts = min(_us(d_start, unit_us) + 1, _us(d_end, unit_us))
        common = {"name": "send", "cat": "p2p", "id": flow_id, "tid": COMPUTE_TID}
        flows.append({**common, "ph": "s", "ts": s_ts, "pid": src_rank})
        flows.append({**common, "ph": "f", "bp": "e", "ts": d_ts, "pid": dst_rank,
                      "args": {"to": str(action)}})
    return flows


def _meta(name: str, pid: int, args: dict) -> dict:
    return {"name": name, "ph": "M", "pid": pid, "tid": COMPUTE_TID, "args": args}


def _us(value: float, unit_us: float) -> float:
    return round(value * unit_us, 3)
