"""Hypothesis strategies shared by the tests of the cost-aware schedules."""

from __future__ import annotations

from hypothesis import strategies as st

from pipesched import Costs


def costs(low: float = 0.2, high: float = 3.0, comm_high: float = 0.5) -> st.SearchStrategy[Costs]:
    """Costs with F, B, W in [low, high] and a latency in [0, comm_high]."""
    return st.builds(
        Costs,
        F=st.floats(low, high), B=st.floats(low, high), W=st.floats(low, high),
        comm=st.floats(0, comm_high),
    )
