"""zb-auto and the Zero Bubble authors' own heuristic (pipesched.schedules.zb_heuristic).

- the reimplementation gives the authors' code's spans and orders on the paper's measured costs
  (tests/golden/zb_paper_heuristic.json; the 8-rank cases here, every case in
  ``benchmarks/zb_paper_heuristic.py --check``);
- zb-auto is never behind a published schedule at the same memory (its peak in zb-auto's M_B
  model): one case here, every case in the benchmark;
- zb-auto holds the heuristic among its candidates, so under any costs and limit it is never
  behind the heuristic run in zb-auto's own memory model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesched import Costs, simulate
from pipesched.auto import build_auto
from pipesched.schedules.zb_heuristic import build_zb_heuristic, heuristic_orders

CASES = json.loads((Path(__file__).parent / "golden" / "zb_paper_heuristic.json").read_text())["cases"]
RELATIVE = 1e-12  # the same integer costs summed in another order


def _costs(case: dict) -> Costs:
    return Costs(F=case["F"], B=case["B"], W=case["W"], comm=case["comm"])


@pytest.mark.parametrize("case", [c for c in CASES if c["p"] == 8], ids=lambda c: f"F{c['F']}-m{c['m']}-{c['name']}")
def test_the_authors_heuristic_reproduced_on_their_measured_costs(case):
    p = case["p"]
    span, orders = heuristic_orders([(case["F"], case["B"], case["W"])] * p, case["m"], tuple(case["mem"]),
                                    case["max_mem"], case["comm"])
    assert span == case["span"]
    text = "\n".join("".join("FBW"[kind] for kind, _ in stage) for stage in orders)
    assert hashlib.sha256(text.encode()).hexdigest() == case["orders_sha256"]
    schedule = build_zb_heuristic(p, case["m"], _costs(case), case["max_mem"], tuple(case["mem"]))
    assert simulate(schedule, _costs(case)).span == pytest.approx(case["span"], rel=RELATIVE)  # the same timing rule


def test_zb_auto_never_behind_a_published_schedule_at_its_memory():
    case = CASES[1]  # 1.5B, p=8, m=24, ZB-2p: 24 M_B in zb-auto's model
    costs = _costs(case)
    published = simulate(build_zb_heuristic(case["p"], case["m"], costs, case["max_mem"], tuple(case["mem"])), costs)
    plan = build_auto(case["p"], case["m"], costs, memory_limit=published.max_peak_memory, objective="span", milp=False)
    result = simulate(plan, costs)
    assert result.max_peak_memory <= published.max_peak_memory
    assert result.span <= case["span"] * (1 + RELATIVE)


@settings(max_examples=8, deadline=None)
@given(p=st.integers(2, 5), m=st.integers(1, 10), limit=st.integers(1, 6), f=st.floats(0.5, 2), b=st.floats(0.5, 2),
       w=st.floats(0.2, 2), comm=st.floats(0, 0.5), objective=st.sampled_from(["makespan", "span"]))
def test_zb_auto_never_behind_the_heuristic_in_its_own_memory_model(p, m, limit, f, b, w, comm, objective):
    costs = Costs(F=f, B=b, W=w, comm=comm)
    heuristic = build_zb_heuristic(p, m, costs, limit)
    plan = build_auto(p, m, costs, memory_limit=limit, objective=objective, milp=False)
    if heuristic is not None:
        theirs, ours = simulate(heuristic, costs), simulate(plan, costs)
        assert theirs.max_peak_memory <= limit + 1e-9
        assert getattr(ours, objective) <= getattr(theirs, objective) * (1 + 1e-9)
