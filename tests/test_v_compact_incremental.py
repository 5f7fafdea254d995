"""The compaction's incremental memory counts (schedules/v_compact.py) are the full counts.

The compaction tries each cool-down pass at every earlier free slot and keeps the first move
that leaves the rank's peak where it was. It no longer counts the rank's whole profile per try:
with implicit W passes it recounts from the slot tried until the count meets the one it had
(:class:`~pipesched.schedules.v_compact._ImplicitWeights`), and with explicit ones it keeps the
merged W queue's backward slots sorted as they move. Here every try of a whole compaction is
checked against the full count (:func:`~pipesched.schedules.v_compact._memory_profile`): the
same verdict, and after it the same profile.
"""

from __future__ import annotations

import pytest

from pipesched.schedules import v_compact
from pipesched.schedules.v_blocks import v_half_offsets, v_min_offsets


def _full_profile(forward: set[int], backward: set[int], length: int) -> list[int]:
    return v_compact._memory_profile([sorted(forward), [], sorted(backward), []], length)


@pytest.fixture
def every_try_checked(monkeypatch):
    """Wrap the incremental move and the explicit one with the full counts; returns the tries."""
    tries = {"implicit": 0, "explicit": 0}
    incremental = v_compact._ImplicitWeights.moved

    def moved(self, kind, old, slot, peak):
        forward, backward = set(self.forward), set(self.backward)
        (forward if kind in v_compact._FORWARDS else backward).symmetric_difference_update({old, slot})
        full = _full_profile(forward, backward, self.length)
        before = list(self.level)
        verdict = incremental(self, kind, old, slot, peak)
        assert verdict == (max(full) <= peak)
        assert self.level == (full if verdict else before)
        assert self.level == _full_profile(self.forward, self.backward, self.length)
        tries["implicit"] += 1
        return verdict

    explicit = v_compact._moved_explicit

    def moved_explicit(rank_slots, profile, merged, kind, k, slot, peak):
        verdict = explicit(rank_slots, profile, merged, kind, k, slot, peak)
        old = rank_slots[kind][k]
        backward = sorted(rank_slots[v_compact.I1] + rank_slots[v_compact.I0])
        if verdict and kind in (v_compact.I1, v_compact.I0):
            backward = sorted(backward[:backward.index(old)] + backward[backward.index(old) + 1:] + [slot])
        assert merged == backward
        tries["explicit"] += 1
        return verdict

    monkeypatch.setattr(v_compact._ImplicitWeights, "moved", moved)
    monkeypatch.setattr(v_compact, "_moved_explicit", moved_explicit)
    return tries


@pytest.mark.parametrize("offsets", [v_half_offsets, v_min_offsets], ids=["v-half", "v-min"])
@pytest.mark.parametrize("ranks, microbatches", [(3, 9), (4, 8), (5, 13), (7, 16)])
def test_every_try_agrees_with_the_full_count(every_try_checked, offsets, ranks, microbatches):
    v_compact.compacted_orders.__wrapped__(ranks, microbatches, offsets)
    assert every_try_checked["explicit"] > 0
    if offsets is v_half_offsets:  # v-min's second compaction finds no free slot to try at these sizes
        assert every_try_checked["implicit"] > 0
