"""The layout search's proven bound (advise/layout_bound.py) never exceeds the simulated makespan
of any candidate of its group: every family, chunk count, recomputation choice and layer
assignment, on many small models and layouts, dense and with experts split by EP. A group the
search skips by it therefore cannot beat the pick (issue 37 items 1 and 3)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipesched.advise.estimate import Hardware, TransformerCosts
from pipesched.advise.fabric import Fabric, Link
from pipesched.advise.layout_bound import group_bound
from pipesched.advise.layout_costs import LayoutCosts
from pipesched.advise.search import NoCandidateFitsError, advise
from pipesched.advise.transformer import TransformerSpec
from pipesched.advise.transformer_experts import Experts
from pipesched.parallel_layout import ParallelLayout

FABRIC = Fabric(4, Link.from_gbps(100, 0.005), Link.from_gbps(10, 0.02))
CHUNKS = 2  # the search's chunk counts up to this (the V family's 2 among them)
SLACK = 1e-9  # the same durations summed in another order


@st.composite
def groups(draw):
    pp = draw(st.integers(1, 4))
    layers = draw(st.integers(max(2, pp), 8))
    experts = draw(st.none() | st.builds(Experts, st.just(4), st.integers(1, 2), st.sampled_from([128, 512]),
                                         st.integers(0, 1), st.integers(0, 1)))
    spec = TransformerSpec(layers, draw(st.sampled_from([256, 1024])), draw(st.sampled_from([128, 512])),
                           draw(st.integers(1, 2)), heads=8, vocab=draw(st.sampled_from([None, 1000, 32000])),
                           experts=experts)
    tp, dp = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))
    ep = draw(st.sampled_from([1, dp])) if experts is not None else 1
    model = TransformerCosts(spec, pp, Hardware(tflops=100, gpu_memory=1000))  # a limit in bytes: recompute searched
    costs = LayoutCosts.for_layout(model, ParallelLayout(pp, 1, dp, tp), FABRIC, ep=ep)
    return costs, draw(st.integers(1, 8))


@settings(max_examples=30, deadline=None)
@given(groups())
def test_no_candidate_of_a_group_is_faster_than_its_bound(group):
    costs, m = group
    bound = group_bound(costs, [m], m, CHUNKS)
    try:
        candidates = advise(costs.ranks, cost_model=costs, microbatches=m, max_chunks=CHUNKS,
                            refuse_slow=False, workers=1).candidates
    except NoCandidateFitsError as err:
        candidates = err.candidates
    assert candidates
    for c in candidates:
        assert bound <= c.makespan * (1 + SLACK), (c.label(), bound, c.makespan)
    if costs.ep == 1:  # without hidden all-to-alls the bound is at least the mean rank's work
        mean_work = min((1 - c.bubble_ratio) * c.makespan for c in candidates if c.recompute == "none")
        assert bound >= mean_work * (1 - SLACK)
