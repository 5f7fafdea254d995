"""Costs, memory and layer placement estimated from a transformer's dimensions."""

from __future__ import annotations

import pytest

from pipesched.advise import advise
from pipesched.advise.estimate import (
    BYTES_PER_PARAM,
    Hardware,
    TransformerCosts,
    balance_layers,
    orient_layers,
)
from pipesched.advise.transformer import TransformerSpec
from pipesched.errors import ConfigError
from pipesched.placement import loop_placement, v_placement
from pipesched.registry import build_schedule, get_family
from pipesched.simulate import simulate

import pipesched

FAST = [f for f in pipesched.families() if f.name != "zb-auto"]  # see test_advise.py
GPT = TransformerSpec(layers=30, hidden=4096, seq_len=2048, microbatch_size=1, heads=32, vocab=50304)


def test_per_layer_formulas_follow_the_zero_bubble_paper():
    s, b, h, a = 2048, 1, 4096, 32
    f, bw, w = GPT.layer_flops(b)
    assert f == s * b * h * (24 * h + 4 * s)
    assert bw == s * b * h * (24 * h + 8 * s)
    assert w == 24 * s * b * h * h
    korthikanti = TransformerSpec(30, h, s, 1, heads=a, attention="eager", dropout=True)
    assert korthikanti.layer_activation_bytes(b) == s * b * (34 * h + 5 * a * s)
    assert 0.9 < f / w < 1.2 and 1.0 < bw / f < 1.1  # T_F ~ T_B ~ T_W at this size


def test_flash_attention_keeps_no_score_matrix_and_precision_scales_the_bytes():
    s, h, a = 4096, 4096, 32
    flash = TransformerSpec(30, h, s, 1, heads=a)
    eager = TransformerSpec(30, h, s, 1, heads=a, attention="eager", dropout=True)
    assert flash.layer_activation_bytes(1) == 32 * s * h + 4 * a * s  # 16 values per token and width, 2 bytes
    assert eager.layer_activation_bytes(1) / flash.layer_activation_bytes(1) > 5.5  # the 3.26 GB vs 0.57
    fp32 = TransformerSpec(30, h, s, 1, heads=a, dtype_bytes=4)
    assert fp32.layer_activation_bytes(1) == pytest.approx(2 * flash.layer_activation_bytes(1), rel=1e-3)
    assert flash.layer_stash_bytes(1) <= flash.layer_activation_bytes(1)  # W needs only the Linears' parts


def test_a_byte_limit_under_one_stored_microbatch_is_met_by_recomputing():
    model = TransformerCosts(GPT, ranks=4)
    one_layer = GPT.layer_activation_bytes(1)
    state = max(model.state_bytes(4, "loop"))  # weights, grads, optimizer of the fullest rank
    lean = TransformerCosts(GPT, ranks=4, memory_bytes=state + 8 * one_layer)  # a rank holds 7-8 layers
    advice = advise(4, microbatches=8, cost_model=lean, families=FAST)
    best = advice.recommended
    assert best.recompute == "all" and best.fits and best.peak_memory_bytes <= lean.memory_bytes
    free = advise(4, microbatches=8, cost_model=model, families=FAST)
    assert free.recommended.recompute == "none" and best.makespan > free.recommended.makespan
    assert all(c["recompute"] in ("none", "all") and "peak_memory_bytes" in c for c in advice.to_json())


def test_costs_add_up_to_the_model_and_multipliers_follow_the_layer_split():
    model = TransformerCosts(GPT, ranks=8, hardware=Hardware(tflops=100, bandwidth=25))
    f, b, w = model.layer_times()
    head, embedding = model.head_time(), model.embedding_time()
    costs = model.costs(8, "loop", 1.0)
    assert costs.F * 8 == pytest.approx(30 * f + head + embedding)
    assert costs.W * 8 == pytest.approx(30 * w + head + embedding)
    assert embedding < 1e-4 * f  # next to nothing
    counts = model.layers_per_stage(8, "loop")
    stage_time = [n * (f + b + w) for n in counts]
    stage_time[0] += 3 * embedding
    stage_time[-1] += 3 * head
    assert costs.stage_multipliers == pytest.approx([t / (sum(stage_time) / 8) for t in stage_time])
    assert costs.comm == pytest.approx(1e3 * 2 * 2048 * 4096 / 25e9)
    doubled = model.costs(8, "loop", 2.0)
    assert doubled.F == pytest.approx(2 * costs.F) and doubled.comm == pytest.approx(2 * costs.comm)


def _splits(layers, least):
    """Every split of ``layers`` into len(least) stages, stage i holding at least least[i]."""
    if len(least) == 1:
        if layers >= least[0]:
            yield (layers,)
        return
    for n in range(least[0], layers - sum(least[1:]) + 1):
        for rest in _splits(layers - n, least[1:]):
            yield (n, *rest)


def _stage_times(counts, cost, first, last):
    times = [n * cost for n in counts]
    times[0] += first
    times[-1] += last
    return times


def _least(stages, first, last):
    """A stage with extra work may hold no layer; the others hold one at least."""
    extras = [first] + [0.0] * (stages - 2) + [last] if stages > 1 else [first + last]
    return [0 if e > 0 else 1 for e in extras]


def _best_max_cost(layers, stages, cost, first, last):
    return min(max(_stage_times(c, cost, first, last)) for c in _splits(layers, _least(stages, first, last)))


@pytest.mark.parametrize("layers,stages,first,last", [
    (10, 4, 0.0, 0.0), (10, 4, 0.0, 2.5), (9, 3, 1.0, 1.0), (12, 5, 0.0, 4.0), (8, 8, 0.0, 3.0),
])
def test_layer_balance_minimises_the_slowest_stage(layers, stages, first, last):
    counts = balance_layers(layers, stages, 1.0, first, last)
    assert sum(counts) == layers and all(n >= k for n, k in zip(counts, _least(stages, first, last)))
    times = [n * 1.0 for n in counts]
    times[0] += first
    times[-1] += last
    assert max(times) == pytest.approx(_best_max_cost(layers, stages, 1.0, first, last))


def _best_rank_then_stage(layers, rank_of_stage, cost, first, last):
    best = None
    for counts in _splits(layers, _least(len(rank_of_stage), first, last)):
        times = _stage_times(counts, cost, first, last)
        per_rank = {}
        for s, r in enumerate(rank_of_stage):
            per_rank[r] = per_rank.get(r, 0.0) + times[s]
        key = (max(per_rank.values()), max(times))
        best = key if best is None else min(best, key)
    return best


@pytest.mark.parametrize("layers,rank_of_stage,first,last", [
    (11, loop_placement(4, 2), 0.0, 0.0), (10, loop_placement(4, 2), 0.0, 1.5),
    (13, v_placement(4), 0.0, 2.0), (9, v_placement(3), 0.5, 0.5), (12, loop_placement(3, 3), 0.0, 2.5),
])
def test_with_several_stages_per_rank_the_busiest_rank_is_balanced_first(layers, rank_of_stage, first, last):
    counts = balance_layers(layers, len(rank_of_stage), 1.0, first, last, rank_of_stage)
    assert sum(counts) == layers and all(n >= k for n, k in zip(counts, _least(len(rank_of_stage), first, last)))
    times = [n * 1.0 for n in counts]
    times[0] += first
    times[-1] += last
    per_rank = {}
    for s, r in enumerate(rank_of_stage):
        per_rank[r] = per_rank.get(r, 0.0) + times[s]
    assert (max(per_rank.values()), max(times)) == pytest.approx(
        _best_rank_then_stage(layers, rank_of_stage, 1.0, first, last))


def test_interleaving_a_model_that_does_not_split_evenly_loads_no_rank_more_than_one_chunk_does():
    """The Zero Bubble paper's 1.5B model (22 layers, a head worth 1.7 layers) on 8 ranks: two
    chunks per rank must not give any rank more work than one chunk does (the head's rank holds
    the head alone in its second stage rather than a layer besides it)."""
    model = TransformerCosts(TransformerSpec(layers=22, hidden=2304, seq_len=1024, microbatch_size=6, heads=24, vocab=51200), ranks=8)
    layer, head = sum(model.layer_times()), 3 * model.head_time()

    def busiest(stages):
        counts = model.layers_per_stage(stages, "loop")
        work = [0.0] * 8
        for s, n in enumerate(counts):
            work[s % 8] += n * layer + (head if s == stages - 1 else 0.0)
        return max(work)

    assert busiest(16) <= busiest(8) + 1e-9


def test_orienting_a_split_moves_layers_only_between_a_ranks_stages_that_hold_only_layers():
    counts = (2, 2, 2, 1, 1, 1, 1, 0)  # 4 ranks x 2 chunks, the head alone on the last stage
    owner = loop_placement(4, 2)
    movable = (True,) * 7 + (False,)
    late = orient_layers(counts, owner, movable, "heavy-late")
    assert late == (1, 1, 1, 1, 2, 2, 2, 0)
    assert orient_layers(late, owner, movable, "heavy-early") == counts
    assert [late[r] + late[r + 4] for r in range(4)] == [counts[r] + counts[r + 4] for r in range(4)]


def test_the_advisor_simulates_each_layer_assignment_and_reports_the_fastest():
    """Interleaving the Zero Bubble paper's 1.5B model (22 layers and a head worth 1.7 layers
    on 16 stages): each rank holds a 2-layer and a 1-layer chunk, and whether the heavy chunks
    come first or last in model order changes the step. The advisor keeps the faster split and
    says which it is, so the run can be reproduced."""
    spec = TransformerSpec(layers=22, hidden=2304, seq_len=1024, microbatch_size=6, heads=24, vocab=51200)
    model = TransformerCosts(spec, ranks=8, hardware=Hardware(bandwidth=100))
    times = {}
    for name in model.layer_assignments(16, "loop"):
        costs = model.with_layer_assignment(name).costs(16, "loop", 1.0)
        times[name] = simulate(build_schedule("interleaved-1f1b", 8, 24, 2, costs), costs).makespan
    assert {"heavy-early", "heavy-late"} <= set(times) and len(set(times.values())) > 1
    fastest = min(times, key=times.get)
    families = [get_family("1f1b"), get_family("interleaved-1f1b")]
    advice = advise(8, microbatches=24, cost_model=model, families=families, max_chunks=2)
    chosen = next(c for c in advice.candidates if c.chunks == 2)
    assert chosen.layer_assignment == fastest and chosen.makespan == pytest.approx(times[fastest])
    assert chosen.layers_per_stage == model.with_layer_assignment(fastest).layers_per_stage(16, "loop")
    assert chosen.to_json()["layer_assignment"] == fastest
    again = build_schedule(chosen.schedule, 8, chosen.microbatches, chosen.chunks, chosen.costs, chosen.memory_limit)
    assert simulate(again, chosen.costs).makespan == pytest.approx(chosen.makespan)  # its costs are its split's
    one_chunk = next(c for c in advice.candidates if c.chunks == 1)
    assert one_chunk.layer_assignment is None  # one stage per rank: nothing to choose


def test_the_embedding_and_the_head_may_each_hold_a_stage_alone():
    """``k*p - 2`` layers (the Zero Bubble paper's layer counts) interleave one layer per chunk:
    the first stage holds the embedding alone and the last the head alone, which is what the
    authors' code gets by padding the model to ``k*p`` layers; without them it cannot split."""
    spec = TransformerSpec(layers=6, hidden=256, seq_len=128, microbatch_size=1, vocab=1000)
    model = TransformerCosts(spec, ranks=4)
    assert model.layers_per_stage(8, "loop") == (0, 1, 1, 1, 1, 1, 1, 0)
    assert model.layers_per_stage(4, "loop")[0] > 0  # one chunk: the embedding's stage still has layers
    assert 0 < model.costs(8, "loop", 1.0).stage_multipliers[0] < 1e-3  # next to nothing, not nothing
    with pytest.raises(ConfigError, match="at least 8 layers"):
        TransformerCosts(TransformerSpec(layers=6, hidden=256, seq_len=128, microbatch_size=1), ranks=4).layers_per_stage(8, "loop")


def test_interleaving_uneven_chunks_under_a_memory_limit_may_take_a_larger_microbatch_group():
    """22 layers on 16 stages, the heavy chunks last: Megatron's group of p microbatches puts
    each rank's heavy and light chunks out of step with its neighbours'; under a memory limit a
    larger group Megatron accepts is also tried, and kept when it is faster within the limit.
    Without a limit the schedule stays Megatron's default."""
    spec = TransformerSpec(layers=22, hidden=2304, seq_len=1024, microbatch_size=6, heads=24, vocab=51200)
    costs = TransformerCosts(spec, ranks=8, layer_assignment="heavy-late").costs(16, "loop", 1.0)
    default = build_schedule("interleaved-1f1b", 8, 64, 2, costs)
    limited = build_schedule("interleaved-1f1b", 8, 64, 2, costs, memory_limit=16)
    assert default.meta["group"] == 8 and limited.meta["group"] > 8
    faster, megatron = simulate(limited, costs), simulate(default, costs)
    assert faster.makespan < megatron.makespan and faster.max_peak_memory <= 16
    tight = build_schedule("interleaved-1f1b", 8, 64, 2, costs, memory_limit=megatron.max_peak_memory)
    assert tight.meta["group"] == 8  # the larger groups hold more than that


def test_a_heavy_head_gets_fewer_layers_on_the_last_stage():
    counts = balance_layers(22, 8, 1.0, 0.0, 2.0)
    assert counts[-1] < max(counts)


def test_more_stages_than_layers_is_refused():
    with pytest.raises(ConfigError, match="at least 12 layers"):
        balance_layers(10, 12, 1.0, 0.0, 0.0)


def test_gpu_memory_sets_a_limit_that_recommended_schedules_respect():
    model = TransformerCosts(GPT, ranks=8, hardware=Hardware(bandwidth=50, gpu_memory=60))
    advice = advise(8, microbatches=16, cost_model=model, families=FAST)
    best = advice.recommended
    assert best.memory_gb <= 60
    state = model.state_gb(8, "loop")
    counts = model.layers_per_stage(8, "loop")
    held = [n * GPT.layer_params + GPT.embedding_params * (s in (0, 7)) for s, n in enumerate(counts)]
    assert state == pytest.approx(BYTES_PER_PARAM * max(held) / 1e9)
    for c in advice.candidates:
        assert c.fits == (c.memory_gb <= 60 + 1e-6)
    assert best.layers_per_stage is not None and sum(best.layers_per_stage) == 30


def test_too_little_gpu_memory_names_what_the_leanest_schedule_needs():
    model = TransformerCosts(GPT, ranks=4, hardware=Hardware(gpu_memory=20))
    with pytest.raises(ConfigError, match=r"needs [\d.]+ GiB \([\d.]+ GB\) on its fullest rank, weights, gradients and optimizer state"):
        advise(4, microbatches=8, cost_model=model, families=FAST)


@pytest.mark.parametrize("field,value", [("layers", 0), ("hidden", -1), ("heads", 0)])
def test_bad_model_dimensions_are_refused(field, value):
    kwargs = dict(layers=4, hidden=64, seq_len=16, microbatch_size=2)
    kwargs[field] = value
    with pytest.raises(ConfigError, match=field):
        TransformerSpec(**kwargs)


def test_a_limit_in_bytes_bounds_the_whole_footprint_the_advisor_reports():
    # the case: 32 layers, h = s = 4096, b = 1, G = 64 on 8 ranks, --rank-memory-limit 40GiB
    spec = TransformerSpec(layers=32, hidden=4096, seq_len=4096, microbatch_size=1)
    limit = 40 * 2**30
    model = TransformerCosts(spec, ranks=8, memory_bytes=limit)
    families = [get_family(n) for n in ("1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "v-min")]
    advice = advise(8, global_batch=64, microbatch_size=1, cost_model=model, families=families, max_chunks=2)
    fitting = [c for c in advice.candidates if c.fits]
    assert fitting and all(c.peak_memory_bytes <= limit * (1 + 1e-9) for c in fitting)
    assert any(c.peak_memory_bytes > limit for c in advice.candidates if not c.fits)  # the limit binds
    for c in advice.candidates:  # one number: the bytes reported are the GB shown, weights and all
        state = max(model.state_bytes(8 * c.chunks, c.placement))
        assert c.memory_gb == pytest.approx(c.peak_memory_bytes / 1e9) and c.peak_memory_bytes > state
