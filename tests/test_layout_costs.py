"""The whole-layout cost and memory model: ring collectives on two link classes, FSDP's gathers
and reductions on a comm lane, TP's all-reduces on the compute lane, bytes per rank from shapes,
and where each stage's all-gather goes."""

from dataclasses import replace
from math import prod

import pytest

from pipesched import build_schedule, simulate
from pipesched.advise.estimate import Hardware, TransformerCosts
from pipesched.advise.fabric import ACROSS, WITHIN, Fabric, Link, all_gather_time, all_reduce_time, reduce_scatter_time
from pipesched.gather_plan import gather_plan
from pipesched.advise.layout_costs import LayoutCosts
from pipesched.advise.sharded_step import layout_step
from pipesched.advise.transformer import TransformerSpec
from pipesched.advise.transformer_experts import Experts
from pipesched.errors import ConfigError
from pipesched.parallel_layout import ParallelLayout
from pipesched.sharded_bytes import FP32, MIXED, ZERO1, ParamSpec, rank_bytes, rank_state_bytes

FABRIC = Fabric(4, within=Link.from_gbps(100, latency_ms=0.01), across=Link.from_gbps(10, latency_ms=0.05))
SPEC = TransformerSpec(8, 1024, 512, 2, heads=16, vocab=32000)
# The simulated collectives are the ring closed forms summed in another order: floats round at
# about 1e-15 relative, far inside the issue's 5%.
CLOSE = 1e-9


def ring(n: int, nbytes: float, link: Link) -> float:
    """A ring all-gather written out: n-1 steps, each a latency and one n-th of the tensor."""
    return sum(link.latency + nbytes / n / link.bandwidth for _ in range(n - 1))


def test_ring_collectives_are_the_closed_forms():
    link = Link(50.0, 0.02)
    assert all_gather_time(8, 4e6, link) == pytest.approx(ring(8, 4e6, link), rel=CLOSE)
    assert reduce_scatter_time(8, 4e6, link) == pytest.approx(ring(8, 4e6, link), rel=CLOSE)
    assert all_reduce_time(8, 4e6, link) == pytest.approx(2 * ring(8, 4e6, link), rel=CLOSE)
    assert all_gather_time(1, 4e6, link) == 0.0


def test_link_classes_follow_the_order_and_the_node_size():
    layout = ParallelLayout(pp=2, dp_shard=2, tp=4)  # torchtitan's order: tp innermost
    assert FABRIC.link_name(layout, "tp") == WITHIN
    assert FABRIC.link_name(layout, "dp_shard") == ACROSS and FABRIC.link_name(layout, "pp") == ACROSS
    small_tp = ParallelLayout(pp=4, dp_shard=2, tp=2)
    assert FABRIC.link_name(small_tp, "dp_shard") == WITHIN  # 2 x 2 ranks fit a node of 4


def test_tp_adds_two_ring_all_reduces_per_layer_to_each_of_f_and_b_on_the_compute_lane():
    base = TransformerCosts(SPEC, 2, Hardware(tflops=100, bandwidth=10, gpu_memory=80))
    layout = ParallelLayout(pp=2, dp_shard=2, tp=4)
    costs = LayoutCosts.for_layout(base, layout, FABRIC)
    f, b, w = costs.layer_times()
    f0, b0, w0 = base.layer_times()
    activation = SPEC.p2p_bytes(SPEC.microbatch_size)
    per_pass = 2 * 2 * ring(4, activation, FABRIC.within)
    assert f == pytest.approx(f0 / 4 + per_pass, rel=CLOSE)
    assert b == pytest.approx(b0 / 4 + per_pass, rel=CLOSE)
    assert w == pytest.approx(w0 / 4, rel=CLOSE)


def test_a_pipeline_send_is_each_tp_rank_s_slice_on_its_own_link():
    # sequence parallelism: each tp rank holds s/tp tokens between stages and sends them on its
    # own link; without it Megatron-LM's scatter-gather sends 1/tp per rank, then all-gathers
    # the slices over the tp link (one ring all-gather of the whole activation)
    base = TransformerCosts(SPEC, 2, Hardware(tflops=100, bandwidth=10, gpu_memory=80))
    layout = ParallelLayout(pp=2, dp_shard=2, tp=4)
    activation = SPEC.p2p_bytes(SPEC.microbatch_size)
    pp_link = FABRIC.link(layout, "pp")
    with_sp = LayoutCosts.for_layout(base, layout, FABRIC)
    assert with_sp.costs(2, "loop", 1.0).comm == pytest.approx(activation / 4 / pp_link.bandwidth, rel=CLOSE)
    without = LayoutCosts.for_layout(base, layout, FABRIC, sequence_parallel=False)
    assert without.comm_ms() == pytest.approx(activation / 4 / pp_link.bandwidth + ring(4, activation, FABRIC.within),
                                              rel=CLOSE)
    assert with_sp.comm_ms(0.5) == pytest.approx(with_sp.comm_ms() / 2, rel=CLOSE)  # bandwidth-bound: scales


def test_one_dimension_layouts_cost_and_hold_what_the_pipeline_model_says():
    base = TransformerCosts(SPEC, 4, Hardware(tflops=100, bandwidth=10, gpu_memory=80))  # pp's link: across nodes
    costs = LayoutCosts.for_layout(base, ParallelLayout(pp=4, dp_replicate=2), FABRIC)
    assert costs.costs(8, "loop", 1.0) == base.costs(8, "loop", 1.0)
    assert costs.state_bytes(8, "loop") == base.state_bytes(8, "loop")
    assert costs.memory_limit(4, "loop", 0.5) == base.memory_limit(4, "loop", 0.5)


def _step(layout: ParallelLayout):
    base = TransformerCosts(SPEC, layout.pp, Hardware(tflops=100, bandwidth=10, gpu_memory=80))
    costs = LayoutCosts.for_layout(base, layout, FABRIC)
    schedule = build_schedule("1f1b", layout.pp, 4, 1, costs.costs(layout.pp, "loop", 1.0))
    result = simulate(schedule, costs.costs(layout.pp, "loop", 1.0))
    gathered = costs.gathered_bytes_per_stage(layout.pp, "loop")
    reduced = costs.reduced_bytes_per_stage(layout.pp, "loop")
    return result, gathered, reduced, layout_step(result.timeline, gathered, reduced, layout, FABRIC, 4)


def test_fsdp_gathers_sit_before_each_stage_s_first_use_and_rank_0_waits_for_its_whole_gather():
    layout = ParallelLayout(pp=2, dp_shard=2, tp=4)
    result, gathered, _, step = _step(layout)
    link = FABRIC.link(layout, "dp_shard")
    assert step.exposed_gather == pytest.approx(ring(2, gathered[0], link), rel=CLOSE)  # nothing to hide under
    gathers = [span for lane in step.lane for span in lane if span[0] == "AG"]
    assert [s for _, s, _, _ in gathers] == [0, 1]
    assert [e - b for _, _, b, e in gathers] == pytest.approx([ring(2, gathered[s], link) for s in (0, 1)], rel=CLOSE)


def test_each_stage_reduce_scatters_after_its_last_backward_at_the_ring_time():
    layout = ParallelLayout(pp=2, dp_shard=2, tp=4)
    result, _, reduced, step = _step(layout)
    link = FABRIC.link(layout, "dp_shard")
    for rank, lane in enumerate(step.lane):
        (_, stage, start, end), = [span for span in lane if span[0] == "RS"]
        last_backward = max(s.end for s in result.timeline[rank] if s.action[1] in "BIW")
        assert start == pytest.approx(last_backward + step.exposed_gather, rel=CLOSE)
        assert end - start == pytest.approx(ring(2, reduced[stage], link), rel=CLOSE)
    assert step.step_time >= result.makespan + step.exposed_gather


def test_a_rank_s_bytes_divide_states_by_shards_and_tp_and_add_the_gathered_window():
    layout = ParallelLayout(pp=2, dp_shard=2, tp=2)
    big, small = [ParamSpec((2000, 10), tp_dim=0)], [ParamSpec((1000, 10), tp_dim=0), ParamSpec((10,))]
    stages = [rank_state_bytes(s, layout, slots=2, precision=FP32) for s in (small, big)]
    held = rank_bytes(stages, layout.dp_shard, largest_unit=stages[1])
    local = (1000 // 2) * 10 + 10 + (2000 // 2) * 10  # elements after TP's split
    assert held.sharded == 16 * local / 2 + 4 * 3  # fp32 parameter and gradient, Adam's two moments and steps
    assert held.gathered == 4 * local and held.unsharded_grads == 4 * local
    assert held.buffers == (4 + 4) * 1000 * 10  # the largest unit's gather output and reduce input
    assert rank_bytes(stages, layout.dp_shard, window=1).gathered == 4 * 1000 * 10  # the larger stage
    mixed = rank_state_bytes(big, layout, precision=MIXED)
    assert (mixed.gathered_params, mixed.unsharded_grads) == (2 * 10000, 4 * 10000)  # bf16 gathered, fp32 reduced
    whole = ParallelLayout(pp=2)
    assert rank_bytes([rank_state_bytes(s, whole) for s in (small, big)], 1).total == 16 * 30010 + 4 * 3  # no FSDP


def test_a_transformer_s_bytes_are_the_shape_model_s_on_its_blocks():
    spec = SPEC
    assert spec.layer_params == 12 * 1024 ** 2 + 13 * 1024
    layout = ParallelLayout(pp=2, dp_shard=2, tp=4)
    base = TransformerCosts(SPEC, 2, Hardware(tflops=100, bandwidth=10, gpu_memory=80))
    costs = LayoutCosts.for_layout(base, layout, FABRIC)
    block = rank_state_bytes(spec.layer_specs(), layout, precision=MIXED)
    embedding = rank_state_bytes(spec.embedding_specs(), layout, precision=MIXED)
    assert embedding.gathered_params > block.gathered_params  # 32000 x 1024 outweighs a block's 12 x 1024^2
    whole = rank_bytes([block + block + embedding], 2, largest_unit=embedding)
    assert costs.rank_bytes({"layers": 2, "first": True, "last": False}) == whole


def test_zero1_holds_megatron_s_6_plus_12_over_d_bytes_per_parameter_and_moves_what_fsdp_moves():
    # Megatron's distributed optimizer: bf16 weights (2) and fp32 gradients (4) whole, fp32 master
    # weights and Adam's moments (12) sharded; FSDP holds its sharded fp32 gradient (4/d) besides,
    # and a block's gather output and reduce input; with one pipeline rank ZeRO-1 stays whole too
    layout = ParallelLayout(pp=2, dp_shard=4, tp=2)
    specs = [ParamSpec((4000, 10), tp_dim=0), ParamSpec((10,))]
    n = 2000 * 10 + 10  # elements after TP's split
    shard = 500 * 10 + 3  # the fullest shard of each: ceil(2000/4) rows, ceil(10/4) of the bias
    held = rank_state_bytes(specs, layout, precision=ZERO1)
    zero1 = rank_bytes([held], layout.dp_shard, largest_unit=held, zero1=True)
    assert zero1.total == (2 + 4) * n + (4 + 8) * shard + 4 * 2  # 6N + 12N/d, and Adam's two step scalars
    assert zero1.grads == zero1.buffers == 0
    base = TransformerCosts(SPEC, 2, Hardware(tflops=100, bandwidth=10, gpu_memory=80))
    fsdp, megatron = (LayoutCosts.for_layout(base, layout, FABRIC, precision=p) for p in (MIXED, ZERO1))
    rank = {"layers": 4, "first": True, "last": False}
    a, b = fsdp.rank_bytes(rank), megatron.rank_bytes(rank)
    assert a.total - b.total == a.grads + a.buffers and a.grads == a.params
    assert fsdp.grads_on_timeline and not megatron.grads_on_timeline  # Megatron allocates its buffer once
    assert megatron.gathered_bytes_per_stage(4, "loop") == fsdp.gathered_bytes_per_stage(4, "loop")
    assert megatron.reduced_bytes_per_stage(4, "loop") == fsdp.reduced_bytes_per_stage(4, "loop")
    alone = LayoutCosts.for_layout(replace(base, ranks=1), ParallelLayout(pp=1, dp_shard=4), FABRIC, precision=ZERO1)
    whole = alone.rank_bytes({"layers": 8, "first": True, "last": True})
    every = sum(prod(p.shape) for p in SPEC.layer_specs()) * 8 + sum(
        prod(p.shape) for p in SPEC.embedding_specs(True) + SPEC.head_specs(True))
    assert whole.gathered == 2 * every and whole.unsharded_grads == 4 * every and whole.buffers == 0


def test_bad_layout_sizes_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="dp_shard must be a whole number"):
        ParallelLayout(pp=1, dp_shard=0)
    with pytest.raises(ConfigError, match="does not divide"):
        ParallelLayout(pp=2, tp=3).check(6, heads=16)


def test_gathers_go_as_late_as_they_still_hide_and_the_first_one_is_waited_for():
    # stage 0 runs at 0-2, stage 4 first at 2: its gather (1.5) starts at 0.5, after stage 0's (0.5)
    actions = [(0, "F", 0), (0, "F", 1), (4, "F", 0), (4, "F", 1), (4, "B", 0), (0, "B", 0)]
    plan = gather_plan(actions, [1, 1, 1, 1, 2, 2], {0: 0.5, 4: 1.5})
    assert (plan[0].start, plan[0].end, plan[0].wait) == (0.0, 0.5, 0.5)
    assert (plan[4].start, plan[4].end, plan[4].wait) == (0.5, 2.0, 0.0)
    assert plan[4].issue_before == 0 and plan[4].release_after == 4 and plan[0].release_after == 5
    late = gather_plan(actions, [1, 1, 1, 1, 2, 2], {0: 0.5, 4: 0.5})
    assert late[4].issue_before == 1 and late[4].start == 1.5  # issued only once stage 0's second F runs


def test_on_a_simulated_pipeline_later_ranks_gather_later_and_hide_it_in_their_warm_up():
    result = simulate(build_schedule("1f1b", 4, 8, 1))  # unit costs: rank r's first forward at r
    plans = []
    for spans in result.timeline:
        actions = [tuple(s.action) for s in spans]
        plans.append(gather_plan(actions, [s.end - s.start for s in spans], {r: 0.5 for r in range(4)},
                                 starts=[s.start for s in spans]))
    assert plans[0][0].wait == 0.5  # nothing runs before rank 0's first forward
    for rank in (1, 2, 3):
        gather = plans[rank][rank]
        assert gather.wait == 0 and gather.start == pytest.approx(rank - 0.5)  # torch's window issues it at 0


MOE = TransformerSpec(8, 1024, 512, 2, heads=16, vocab=32000, experts=Experts(8, 2, 512, shared=1))


def _moe(layout: ParallelLayout, ep: int, spec: TransformerSpec = MOE) -> LayoutCosts:
    base = TransformerCosts(spec, layout.pp, Hardware(tflops=100, bandwidth=10, gpu_memory=80))
    return LayoutCosts.for_layout(base, layout, FABRIC, ep=ep)


@pytest.mark.parametrize("ep, link", [(4, FABRIC.within), (8, FABRIC.across)])
def test_ep_adds_a_dispatch_and_a_combine_all_to_all_per_layer_to_f_and_b_on_its_group_s_link(ep, link):
    # EP takes the innermost data-parallel ranks: at tp 1, ep 4 fits a node of 4, ep 8 spans two
    layout = ParallelLayout(pp=2, dp_shard=8)
    f0, b0, w0 = _moe(layout, 1).layer_times()
    f, b, w = _moe(layout, ep).layer_times()
    tokens = MOE.seq_len * MOE.microbatch_size
    buffer = tokens * 2 * MOE.hidden * MOE.dtype_bytes  # a copy of each token per routed expert (top 2)
    per_pass = 2 * ring(ep, buffer, link)  # dispatch and combine: n-1 pairwise steps, as a ring's
    assert (f - f0, b - b0, w - w0) == pytest.approx((per_pass, per_pass, 0.0), rel=CLOSE, abs=1e-12)


def test_a_rank_holds_its_ep_share_of_the_routed_experts():
    layout = ParallelLayout(pp=2, dp_replicate=8)  # no FSDP: 16 bytes per element (fp32 weights, grads, Adam)
    bare = replace(MOE, vocab=None)  # no head: 4 layers on each rank, whatever EP's all-to-alls cost
    one, two = (_moe(layout, ep, bare).ranks_bytes(2, "loop")[1] for ep in (1, 2))
    routed_per_layer = 3 * 8 * 512 * 1024  # gate, up, down of the 8 experts
    assert one.sharded - two.sharded == 16 * 4 * routed_per_layer // 2  # 4 layers, half of each's experts


def test_the_first_dense_layers_hold_a_dense_mlp_and_no_experts():
    bare = replace(MOE, vocab=None)
    dense = replace(bare, experts=replace(MOE.experts, dense_layers=2))
    layout = ParallelLayout(pp=2, dp_replicate=8)
    stages, alike = (_moe(layout, 2, spec)._stage_bytes(2, "loop") for spec in (dense, bare))
    h, width = 1024, 512
    experts = 8 * h + 3 * width * h + 3 * 4 * width * h  # router, shared expert, this rank's 4 of 8 routed
    mlp = 8 * h * h + 5 * h  # a dense block's fc1 and fc2 with their biases
    tensors = (1 + 3 + 3) - 4  # Adam's 4-byte step per tensor: router, shared and routed, less fc1's and fc2's
    assert stages[1] == alike[1]
    assert alike[0].steady - stages[0].steady == 2 * (16 * (experts - mlp) + 4 * tensors)


def test_the_first_dense_layers_run_and_keep_what_a_dense_layer_does():
    # 2 dense layers then 6 with experts on 2 ranks: the first stage holds both dense ones, priced
    # as the same model without experts prices a layer (no router, no all-to-all), the second 4 MoE
    bare = replace(MOE, vocab=None)
    spec = replace(bare, experts=replace(MOE.experts, dense_layers=2))
    layout = ParallelLayout(pp=2, dp_shard=8)
    costs, plain = _moe(layout, 4, spec), _moe(layout, 1, replace(bare, experts=None))
    assert costs.layer_times(experts=False) == plain.layer_times()
    dense, moe = sum(plain.layer_times()), sum(costs.layer_times())
    c = costs.costs(2, "loop", 1.0)
    first, second = 2 * dense + 2 * moe, 4 * moe
    assert c.stage_multipliers == pytest.approx((2 * first / (first + second), 2 * second / (first + second)), rel=CLOSE)
    assert c.F + c.B + c.W == pytest.approx((first + second) / 2, rel=CLOSE)  # the mean rank's work
    b = spec.microbatch_size
    kept = [s.keep for s in costs.stage_sizes(2, "loop", 1.0).stages]
    assert kept[0] == pytest.approx(2 * (plain.spec.layer_activation_bytes(b) + spec.layer_activation_bytes(b)), rel=CLOSE)
    assert kept[1] == pytest.approx(4 * spec.layer_activation_bytes(b), rel=CLOSE)
    assert spec.layer_activation_bytes(b, experts=False) == plain.spec.layer_activation_bytes(b)
    assert spec.layer_stash_bytes(b, experts=False) == plain.spec.layer_stash_bytes(b)


@pytest.mark.parametrize("ep", [4, 8])
def test_dualpipe_s_pair_hides_each_half_s_all_to_all_behind_the_other_half_s_compute(ep):
    # ep 4 within a node: each half's all-to-alls fit under the other's compute; ep 8 across
    # nodes: what outlasts it is exposed
    layout = ParallelLayout(pp=2, dp_shard=8)
    costs = _moe(layout, ep)
    c = costs.costs(4, "v", 1.0)
    sent = MOE.layers / layout.pp * 2 * costs.all_to_all_ms()  # per rank and pass
    forward, backward = c.F, c.B + c.W  # an overlapped pair's backward is a full one
    exposed = max(0.0, sent - (backward - sent)) + max(0.0, sent - (forward - sent))
    assert (exposed == 0) == (ep == 4)
    pair = max(forward, backward) + c.overlap * min(forward, backward)  # Costs.overlap's rule
    assert pair == pytest.approx((forward - sent) + (backward - sent) + exposed, rel=CLOSE)
    assert _moe(layout, 1).costs(4, "v", 1.0).overlap == 1.0  # nothing sent: one half after the other


def test_ep_is_refused_on_a_dense_model_and_where_it_does_not_divide():
    with pytest.raises(ConfigError, match="needs a model with experts"):
        LayoutCosts.for_layout(TransformerCosts(SPEC, 2), ParallelLayout(pp=2, dp_shard=2), FABRIC, ep=2)
    with pytest.raises(ConfigError, match="does not divide the 8 experts"):
        _moe(ParallelLayout(pp=2, dp_shard=6), 3)
    with pytest.raises(ConfigError, match="does not divide the 2 data-parallel ranks"):
        _moe(ParallelLayout(pp=2, dp_shard=2), 4)
