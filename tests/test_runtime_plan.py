"""The communication plan: every message is sent once, received once, in the sender's order."""

from __future__ import annotations

import pytest

import pipesched
from pipesched.runtime.plan import ACT, GRAD, links, plan_rank


def _all_cases():
    for family in (f for f in pipesched.families() if f.parameter_copies == 1):  # what the runtime runs
        for ranks, m in ((2, 4), (4, 8), (3, 5)):
            yield family.name, ranks, m


@pytest.mark.parametrize("name,ranks,m", list(_all_cases()))
def test_every_send_has_one_matching_receive_in_link_order(name, ranks, m):
    schedule = pipesched.build_schedule(name, ranks, m)
    plans = [plan_rank(schedule, r) for r in range(ranks)]
    for src, dst in links(schedule):
        sent = [msg for msg in plans[src].sends if msg is not None and msg.dst == dst]
        assert plans[dst].incoming[src] == sent
    needed = sorted(msg for p in plans for msg in p.needs if msg is not None)
    sent_all = sorted(msg for p in plans for msg in p.sends if msg is not None)
    assert needed == sent_all
    tags = [msg.tag for msg in sent_all]
    assert len(tags) == len(set(tags))


def test_v_turn_is_handed_over_without_a_message():
    schedule = pipesched.build_schedule("zb-v", 2, 4)
    p = schedule.ranks
    plans = [plan_rank(schedule, r) for r in range(p)]
    # stages p-1 and p live on the same rank: neither activations nor gradients cross between them
    for plan in plans:
        for msg in list(plan.sends) + list(plan.needs):
            if msg is None:
                continue
            assert not (msg.kind == ACT and msg.stage == p - 1)
            assert not (msg.kind == GRAD and msg.stage == p)


def test_actions_that_need_a_message_name_its_producer():
    schedule = pipesched.build_schedule("interleaved-1f1b", 2, 4)
    for r in range(2):
        plan = plan_rank(schedule, r)
        for action, need in zip(plan.actions, plan.needs):
            if need is None:
                continue
            expected = action.stage - 1 if action.kind == "F" else action.stage + 1
            assert need.stage == expected and need.microbatch == action.microbatch
            assert need.src == schedule.placement[expected] and need.dst == r
