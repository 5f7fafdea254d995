"""Published runs through the layout model (inputs: pipesched/advise/published.py, docs/layouts.md).

The full searches over every layout take tens of CPU seconds each and live in
benchmarks/published_layouts.py (results in benchmarks/RESULTS.md); here the published settings
are priced, and the search runs with the published tensor parallelism (and the 145.6B row's pipeline)
fixed (Megatron-LM's 1T row, whose 64-stage pipeline of 512 microbatches takes minutes to search
in full, runs in benchmarks/advise_scale.py)."""

import pytest

from pipesched.advise.layout_search import advise_whole_layouts, evaluate_setting
from pipesched.advise.published import (DEEPSEEK_V3, MBRIDGE_70B, MEGATRON_145B, TORCHTITAN_405B, TORCHTITAN_70B,
                                        PublishedRun)

PUBLISHED_405B_RATIO = 128 / 100  # torchtitan's tokens/s per GPU, interleaved 1F1B over 1F1B


def _priced(run: PublishedRun, setting: tuple[str, int, int]):
    schedule, chunks, microbatches = setting
    return evaluate_setting(run.gpus, run.model(), run.global_batch, run.fabric(), run.layout, schedule, chunks,
                            microbatches, run.recompute, sequence_parallel=run.sequence_parallel, ep=run.ep,
                            precision=run.precision)


@pytest.fixture(scope="module")
def torchtitan_405b():
    return [_priced(TORCHTITAN_405B, setting) for setting in TORCHTITAN_405B.settings]


def test_405b_settings_fit_and_interleaved_is_faster(torchtitan_405b):
    (one, one_fits), (interleaved, interleaved_fits) = torchtitan_405b
    assert one_fits and interleaved_fits
    assert one.step_time > interleaved.step_time


def test_405b_ratio_within_ten_percent_of_the_published(torchtitan_405b):
    # torchtitan's defaults at the published commit: 8 microbatches for both schedules (published.py)
    (one, _), (interleaved, _) = torchtitan_405b
    assert one.step_time / interleaved.step_time == pytest.approx(PUBLISHED_405B_RATIO, rel=0.10)


def test_405b_interleaved_holds_less_than_1f1b_as_published(torchtitan_405b):
    # ranks 0-3 of interleaved run all 16 forward chunks first: their activation peak comes before
    # any unsharded gradient exists (advise/held_gradients.py); 1F1B's ranks hold both at once
    (one, _), (interleaved, _) = torchtitan_405b
    assert one.candidate.peak_memory_bytes > interleaved.candidate.peak_memory_bytes  # 82.5 > 72.7 GiB published


@pytest.mark.parametrize("run, fixed", [(TORCHTITAN_70B, ("tp",)), (MEGATRON_145B, ("tp", "pp"))],
                         ids=lambda x: x.name if isinstance(x, PublishedRun) else "-".join(x))
def test_the_published_layout_fits_and_the_pick_with_its_sizes_fixed_is_predicted_at_least_as_fast(run, fixed):
    # the search is complete at the published microbatch size, so it holds the published setting
    # or one at least as fast (the 145.6B row's tp alone leaves 64-stage pipelines: benchmarks/)
    published = [_priced(run, s) for s in run.settings]
    assert all(fits for _, fits in published)
    fastest = min(p.step_time for p, _ in published)
    advice = advise_whole_layouts(run.gpus, run.model(), run.global_batch, run.fabric(),
                                  fixed={d: getattr(run.layout, d) for d in fixed}, sequence_parallel=run.sequence_parallel,
                                  precision=run.precision)
    best = advice.recommended
    assert all(getattr(best, d) == getattr(run.layout, d) for d in fixed)
    assert best.pp * best.dp * best.dp_shard * best.tp == run.gpus
    assert best.step_time <= fastest * (1 + 1e-9)  # floats summed in another order


def test_deepseek_v3_s_published_layout_fits_with_its_experts_split_64_ways():
    # PP 16 x EP 64 over 128 ZeRO-1 ranks, DualPipe: each rank holds 4 of the 256 routed experts
    # per layer; recomputing, as the BF16 model needs (published.py: DeepSeek caches FP8 instead)
    (row, fits), = [_priced(DEEPSEEK_V3, s) for s in DEEPSEEK_V3.settings]
    assert fits and row.ep == 64 and row.candidate.schedule == "dualpipev"
    assert row.candidate.costs.overlap < 1  # its pairs hide all-to-alls behind the other half


def test_megatron_bridge_70b_s_published_layout_fits_with_its_distributed_optimizer():
    # ZeRO-1 (published.py) holds no sharded fp32 gradient and no collective buffers: priced as
    # FSDP the fullest rank needed 84.8 GiB, over the 80 (tests/test_layout_costs.py has the bytes)
    (row, fits), = [_priced(MBRIDGE_70B, s) for s in MBRIDGE_70B.settings]
    assert fits and row.candidate.peak_memory_bytes <= 80 * 2 ** 30
    assert all(rank["grads"] == rank["buffers"] == 0 < rank["unsharded_grads"] for rank in row.bytes_per_rank)


def test_megatron_bridge_70b_s_uneven_layer_goes_to_a_middle_rank_not_the_first():
    # 80 layers on 8 ranks x 5 stages: the last rank holds the head and 9, one other rank 11; the
    # embedding costs a little, so the tie between ranks leaves rank 0 (the deepest warm-up) at 10
    model = MBRIDGE_70B.model()
    counts = model.layers_per_stage(40, "loop")
    per_rank = [sum(counts[r::8]) for r in range(8)]
    assert per_rank[0] == 10 and per_rank[7] == 9 and sorted(per_rank[1:7]) == [10] * 5 + [11]
