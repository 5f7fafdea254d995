"""The layout search's proven bound (advise/layout_bound.py): on many small models and layouts,
dense and with experts split by EP, at GPU memories from too small for anything to ample, its
makespan form is never above the simulated makespan of any candidate of its group (every family,
chunk count, recomputation choice and layer assignment), and its step form never above the step
of any member's fitting row (collectives and per-member memory included). A group the search
skips by it therefore cannot beat the pick (issue 37 items 1 and 3)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipesched.advise.estimate import GB, Hardware, TransformerCosts
from pipesched.advise.fabric import Fabric, Link
from pipesched.advise.layout_bound import group_bound
from pipesched.advise.layout_costs import LayoutCosts
from pipesched.advise.layout_rows import pricer
from pipesched.advise.layout_search import state_bytes
from pipesched.advise.search import NoCandidateFitsError, advise
from pipesched.advise.transformer import TransformerSpec
from pipesched.advise.transformer_experts import Experts
from pipesched.parallel_layout import ParallelLayout

FABRIC = Fabric(4, Link.from_gbps(100, 0.005), Link.from_gbps(10, 0.02))
CHUNKS = 2  # the search's chunk counts up to this (the V family's 2 among them)
SLACK = 1e-9  # the same durations summed in another order
LATENCY = 0.05  # ms per all-reduce bucket between replicas


def _members(spec: TransformerSpec, pp: int, tp: int, dp: int, ep: int, gpu_memory: float):
    """Every layout of the group (dp as replicas or as shards), leanest first, as the search orders them."""
    model = TransformerCosts(spec, pp, Hardware(tflops=100, gpu_memory=gpu_memory))
    layouts = {ParallelLayout(pp, dp, 1, tp), ParallelLayout(pp, 1, dp, tp)}
    members = [(lay, LayoutCosts.for_layout(model, lay, FABRIC, ep=ep)) for lay in layouts]
    return sorted(members, key=lambda m: state_bytes(m[1]))


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
    ample = _members(spec, pp, tp, dp, ep, 1000.0)
    # memory for the fullest rank's state plus some stage-microbatches' activations: from none to plenty
    state = max(state_bytes(c) for _, c in ample)
    keep = max(s.keep for s in ample[0][1].stage_sizes(pp, "loop", 1.0).stages)
    held = draw(st.floats(0.0, 3.0 * pp + 2))
    return _members(spec, pp, tp, dp, ep, (state + held * keep) / GB), draw(st.integers(1, 8))


def _search(members, m):
    lead = members[0][1]
    try:
        return advise(lead.ranks, cost_model=lead, microbatches=m, max_chunks=CHUNKS, refuse_slow=False, workers=1,
                      price=pricer(members, FABRIC, LATENCY)).candidates
    except NoCandidateFitsError as err:
        return err.candidates


@settings(max_examples=30, deadline=None)
@given(groups())
def test_no_candidate_of_a_group_is_faster_than_its_bound(group):
    members, m = group
    makespan_bound = group_bound(members, [m], m, CHUNKS)
    step_bound = group_bound(members, [m], m, CHUNKS, FABRIC, LATENCY)
    candidates = _search(members, m)
    assert candidates
    for c in candidates:
        assert makespan_bound <= c.makespan * (1 + SLACK), (c.label(), makespan_bound, c.makespan)
        for (layout, _), row in zip(members, c.priced):
            if row.candidate.fits:
                assert step_bound <= row.step_time * (1 + SLACK), (layout, c.label(), step_bound, row.step_time)
    if members[0][1].ep == 1:  # without hidden all-to-alls the bound is at least the mean rank's work
        mean_work = min((1 - c.bubble_ratio) * c.makespan for c in candidates if c.recompute == "none")
        assert makespan_bound >= mean_work * (1 - SLACK)


def test_memory_that_holds_few_forwards_raises_the_bound_and_keeps_it_below_every_fitting_row():
    """p = 4 ranks, 8 layers (no vocabulary: every stage holds layers), 8 microbatches: a rank waiting for its second stage's first forward
    can fill that wait only with forwards of its first stage, each holding its activations. At
    some memory between the state alone and the state with room for 20 stage-microbatches the
    bound rises above the same group's with ample memory, and no fitting row of any member is
    below it there."""
    spec = TransformerSpec(8, 1024, 512, 1, heads=8, vocab=None)
    ample = _members(spec, 4, 1, 2, 1, 1000.0)
    free = group_bound(ample, [8], 8, CHUNKS, FABRIC, LATENCY)
    state = max(state_bytes(c) for _, c in ample)
    keep = max(s.keep for s in ample[0][1].stage_sizes(4, "loop", 1.0).stages)
    sizes = [_members(spec, 4, 1, 2, 1, (state + n / 4 * keep) / GB) for n in range(80)]
    raised = [(group_bound(tight, [8], 8, CHUNKS, FABRIC, LATENCY), tight) for tight in sizes]
    bound, tight = max(raised, key=lambda r: r[0])
    assert bound > free * (1 + SLACK)
    rows = [row for c in _search(tight, 8) for row in c.priced if row.candidate.fits]
    assert rows
    assert bound <= min(row.step_time for row in rows) * (1 + SLACK)


def test_a_search_asked_for_dualpipe_is_never_pruned_by_the_one_pipeline_bound():
    """The fill argument is one pipeline's; DualPipe's two model copies start both ends at once,
    so a layout search that tries it (``families=``) prunes no group by the bound."""
    from pipesched.advise.candidates import batch_plan
    from pipesched.advise.layout_search import LayoutProblem, _bound
    from pipesched.registry import get_family

    spec = TransformerSpec(8, 1024, 512, 1, heads=8, vocab=32000)
    members = _members(spec, 4, 1, 2, 1, 1000.0)
    problem = LayoutProblem(8, 16, FABRIC)
    plan = batch_plan(4, 8, None, None, 1, None)
    one_pipeline = {"families": [get_family("1f1b")]}
    assert _bound(members, problem, one_pipeline, plan) > 0
    assert _bound(members, problem, {"families": [get_family("1f1b"), get_family("dualpipe")]}, plan) == 0.0
