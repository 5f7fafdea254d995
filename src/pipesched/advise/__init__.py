"""Choosing the schedule with numbers: search, simulate and rank every candidate for a setup.

No torch here: the advisor plans from costs (given, estimated from a model description, or
measured by the runtime and handed in as costs).
"""

from .candidates import BatchPlan, batch_plan
from .costmodel import CostModel, ScaledCosts
from .search import Advice, Candidate, NoCandidateFitsError, advise

__all__ = [
    "Advice",
    "BatchPlan",
    "Candidate",
    "CostModel",
    "NoCandidateFitsError",
    "ScaledCosts",
    "advise",
    "batch_plan",
]
