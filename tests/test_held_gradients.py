"""Unsharded gradients on the timeline (pipesched.advise.held_gradients): held from a stage's
first B or W to its last, summed with the activations held at each time."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesched.actions import Action
from pipesched.advise.held_gradients import gradient_passes, peak_with_gradients
from pipesched.execution import Span


def test_a_stage_holds_gradients_from_its_first_weight_pass_to_its_last():
    spans = [Span(Action(0, "F", 0), 0, 1), Span(Action(1, "F", 0), 1, 2), Span(Action(1, "I", 0), 2, 3),
             Span(Action(0, "B", 0), 3, 5), Span(Action(1, "W", 0), 5, 6), Span(Action(1, "W", 1), 6, 7)]
    assert gradient_passes(spans) == [(3, 5, 0), (5, 7, 1)]  # I computes none; stages in the order they start


def test_gradients_that_appear_after_the_activation_peak_do_not_add_to_it():
    curve = _arrays([(0.0, 0.0), (0.0, 2.0), (1.0, 4.0), (3.0, 1.0)])  # activations: peak 4 until time 3
    assert peak_with_gradients(*curve, [(3.0, 5.0, 3.0)]) == 4.0  # forwards first: the peak, then 1 + 3
    assert peak_with_gradients(*curve, [(2.0, 5.0, 3.0)]) == 7.0  # a backward during the peak: both
    assert peak_with_gradients(*curve, []) == 4.0


def _arrays(curve):
    """A memory curve's (time, level) pairs as its times and levels (``SimResult.memory_steps``)."""
    return np.array([t for t, _ in curve], float), np.array([level for _, level in curve], float)


def _peak_time_by_time(curve, intervals):
    """The definition, one time at a time: the level then plus the gradients held then, in order."""
    times = sorted({t for t, _ in curve} | {t for a, b, _ in intervals for t in (a, b)})
    best, i, level = 0.0, 0, 0.0
    for t in times:
        while i < len(curve) and curve[i][0] <= t:
            level = curve[i][1]
            i += 1
        best = max(best, level + sum(size for a, b, size in intervals if a <= t <= b))
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0, 1e9)), max_size=30),
       st.lists(st.tuples(st.floats(0, 50), st.floats(0, 20), st.floats(0, 1e9)), max_size=4))
def test_the_peak_by_arrays_is_the_time_by_time_sum_to_the_bit(steps, raw):
    curve = [(0.0, 0.0)] + sorted(steps, key=lambda s: s[0])  # a memory curve: times in order
    intervals = [(a, a + length, size) for a, length, size in raw]
    assert peak_with_gradients(*_arrays(curve), intervals) == _peak_time_by_time(curve, intervals)
