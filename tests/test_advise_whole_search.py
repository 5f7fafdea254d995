"""The whole-layout search is complete: the user's microbatch size, every family kept per layout,
verdicts from every candidate (issue 37). A small model, so that every layout's search is exact
and quick; the 1T and 405B searches run in benchmarks/advise_scale.py."""

from dataclasses import replace

import pytest

from pipesched.advise.estimate import Hardware, TransformerCosts
from pipesched.advise.fabric import Fabric, Link
from pipesched.advise.layout_search import advise_whole_layouts, evaluate_setting
from pipesched.advise.transformer import TransformerSpec
from pipesched.parallel_layout import ParallelLayout
from pipesched.registry import get_family

FABRIC = Fabric(4, Link.from_gbps(100, 0.005), Link.from_gbps(10, 0.02))
SPEC = TransformerSpec(8, 1024, 512, 2, heads=16, vocab=32000)
GPUS, BATCH = 16, 64


def _model(gpu_memory: float = 40.0, spec: TransformerSpec = SPEC) -> TransformerCosts:
    return TransformerCosts(spec, 1, Hardware(tflops=100, gpu_memory=gpu_memory))


def _families(*names):
    return [get_family(n) for n in names]


def test_every_row_keeps_the_user_s_microbatch_size():
    advice = advise_whole_layouts(GPUS, _model(), BATCH, FABRIC, families=_families("1f1b", "interleaved-1f1b"))
    for row in advice.candidates:
        c = row.candidate
        assert c.microbatch_size == SPEC.microbatch_size
        assert c.microbatches == BATCH // (row.dp * row.dp_shard) // SPEC.microbatch_size


def test_other_microbatch_sizes_only_where_the_user_opens_the_count():
    advice = advise_whole_layouts(GPUS, _model(), BATCH, FABRIC, fixed={"pp": 4, "tp": 1, "dp_shard": 1},
                                  families=_families("1f1b"), max_microbatches=16, min_microbatch_size=1)
    assert {r.candidate.microbatches for r in advice.candidates} <= {1, 2, 4, 8, 16}
    assert "1, 2, 4, 8, 16 microbatches" in advice.searched[0]


@pytest.mark.parametrize("names", [("1f1b", "interleaved-1f1b"), ("gpipe", "interleaved-1f1b"),
                                   ("interleaved-1f1b", "zb-h1")])
def test_two_schedules_asked_give_rows_of_both_for_a_layout_where_both_fit(names):
    advice = advise_whole_layouts(GPUS, _model(), BATCH, FABRIC, fixed={"pp": 4, "tp": 2, "dp_shard": 2},
                                  families=_families(*names))
    assert {r.candidate.schedule for r in advice.candidates} == set(names)


def test_each_layout_holds_the_best_fitting_candidate_of_every_family_or_names_why_not():
    names = ("1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v")
    advice = advise_whole_layouts(GPUS, _model(), BATCH, FABRIC, fixed={"tp": 2}, families=_families(*names))
    layouts = {(r.pp, r.dp, r.dp_shard) for r in advice.candidates}
    for pp, dp, shard in layouts:
        rows = [r for r in advice.candidates if (r.pp, r.dp, r.dp_shard) == (pp, dp, shard)]
        kept = [r.candidate.schedule for r in rows]
        assert len(kept) == len(set(kept))  # one row per family: its best
        missing = set(names if pp > 1 else ("1f1b",)) - set(kept)
        assert all(name in rows[0].searched for name in missing)


def test_the_best_row_of_a_family_is_its_fastest_fitting_setting():
    fixed = ParallelLayout(pp=4, dp_replicate=2, dp_shard=1, tp=2)
    advice = advise_whole_layouts(GPUS, _model(), BATCH, FABRIC, fixed={"pp": 4, "tp": 2, "dp_replicate": 2},
                                  families=_families("interleaved-1f1b"), max_chunks=2)
    row = advice.recommended
    m = BATCH // fixed.dp // SPEC.microbatch_size
    priced = [evaluate_setting(GPUS, _model(), BATCH, FABRIC, fixed, "interleaved-1f1b", 2, m, recompute)
              for recompute in (False, True)]
    fitting = [p for p, fits in priced if fits]
    assert row.step_time == pytest.approx(min(p.step_time for p in fitting), rel=1e-12)


def test_a_family_over_the_limit_storing_activations_is_kept_recomputing_them():
    # at 80% of what it needs storing activations, interleaved cannot be steered under the limit
    # (its smallest microbatch group holds too much); recomputing, it fits
    spec = replace(SPEC, microbatch_size=8)
    fixed = {"pp": 4, "tp": 1, "dp_shard": 1}
    stored = advise_whole_layouts(GPUS, _model(80.0, spec), 256, FABRIC, fixed=fixed,
                                  families=_families("interleaved-1f1b"), max_chunks=2)
    need = stored.recommended.candidate.peak_memory_bytes
    assert stored.recommended.candidate.recompute == "none"
    tight = advise_whole_layouts(GPUS, _model(need * 0.8 / 1e9, spec), 256, FABRIC, fixed=fixed,
                                 families=_families("interleaved-1f1b"), max_chunks=2)
    row = tight.recommended
    assert row.candidate.schedule == "interleaved-1f1b" and row.candidate.recompute == "all"
    assert row.candidate.peak_memory_bytes <= need * 0.8
    # the retry as built runs in the worker that failed to steer (beside 1f1b's): the same advice
    two = {"fixed": fixed, "families": _families("interleaved-1f1b", "1f1b"), "max_chunks": 2}
    forked = advise_whole_layouts(GPUS, _model(need * 0.8 / 1e9, spec), 256, FABRIC, workers=2, **two)
    assert any(r.candidate.schedule == "interleaved-1f1b" and r.candidate.recompute == "all" for r in forked.candidates)
    assert forked == advise_whole_layouts(GPUS, _model(need * 0.8 / 1e9, spec), 256, FABRIC, workers=1, **two)


def test_a_layout_is_left_out_only_when_none_of_its_candidates_fits():
    names = ("1f1b", "zb-h1")
    model = _model(6.0)
    advice = advise_whole_layouts(GPUS, model, BATCH, FABRIC, fixed={"tp": 1, "dp_shard": 1},
                                  families=_families(*names), max_chunks=1)
    for line in advice.skipped:
        if "no candidate fits its memory" not in line:
            continue
        pp = int(line.split()[1])
        layout = ParallelLayout(pp=pp, dp_replicate=GPUS // pp)
        m = BATCH // layout.dp // SPEC.microbatch_size
        for name in names if pp > 1 else ("1f1b",):
            for recompute in (False, True):
                _, fits = evaluate_setting(GPUS, model, BATCH, FABRIC, layout, name, 1, m, recompute)
                assert not fits


def test_every_layout_has_rows_or_a_verdict_and_a_skipped_one_cannot_beat_the_pick():
    # no "not searched": each layout has rows, or is refused, does not fit, or is proven slower
    # (advise/layout_bound.py); searched alone, a proven-slower layout is indeed no faster
    names = ("1f1b", "interleaved-1f1b", "zb-v")
    done = []
    advice = advise_whole_layouts(GPUS, _model(), BATCH, FABRIC, families=_families(*names),
                                  layouts_done=lambda *counts: done.append(counts))
    verdicts = ("cannot beat the pick", "pipeline ranks for", "tp above", "no candidate fits", "alone need")
    assert all(any(v in line for v in verdicts) for line in advice.skipped)
    slower = [line for line in advice.skipped if "cannot beat the pick" in line]
    assert slower and done[-1][0] == done[-1][1] and [d for d, _ in done] == sorted(d for d, _ in done)
    pick = advice.recommended.step_time
    for line in slower:
        pp, dp, shard, tp = (int(x) for x in line.split(":")[0].split()[1::3])
        alone = advise_whole_layouts(GPUS, _model(), BATCH, FABRIC, families=_families(*names),
                                     fixed={"pp": pp, "dp_replicate": dp, "dp_shard": shard, "tp": tp})
        assert alone.recommended.step_time >= pick


def test_each_row_is_the_simulation_of_the_schedule_its_build_call_rebuilds():
    # what `pipesched export` / `simulate` rebuild from a row (advise_howto prints the call)
    from pipesched.registry import build_schedule
    from pipesched.simulate import simulate

    advice = advise_whole_layouts(GPUS, _model(), BATCH, FABRIC, fixed={"pp": 4, "tp": 2, "dp_shard": 2},
                                  families=_families("1f1b", "interleaved-1f1b", "zb-h1", "zb-v"))
    stored = [row for row in advice.candidates if row.candidate.recompute == "none"]
    assert len(stored) >= 3
    for row in stored:
        c = row.candidate
        objective = {"objective": c.objective} if c.objective else {}
        again = simulate(build_schedule(c.schedule, row.pp, c.microbatches, c.chunks, c.costs, c.memory_limit,
                                        **objective), c.costs)
        assert (again.makespan, again.bubble_ratio, again.peak_memory) == (c.makespan, c.bubble_ratio, c.peak_per_rank)


def test_a_row_s_pipeline_bubble_is_the_busiest_rank_s_idle_the_rest_is_waiting_for_it():
    # 8 layers on 8 stages: the last also holds the head, so its rank sets the pace and the
    # others wait for it; bubble_ratio counts both, pipeline_bubble the pace-setter's fill and drain
    from pipesched.registry import build_schedule
    from pipesched.simulate import simulate

    layout = ParallelLayout(pp=4, dp_replicate=2, tp=2)
    m = BATCH // layout.dp // SPEC.microbatch_size
    row, _ = evaluate_setting(GPUS, _model(), BATCH, FABRIC, layout, "interleaved-1f1b", 2, m, False)
    c = row.candidate
    again = simulate(build_schedule(c.schedule, layout.pp, m, c.chunks, c.costs, c.memory_limit), c.costs)
    assert row.pipeline_bubble == 1 - max(again.busy) / again.makespan
    assert row.pipeline_bubble < c.bubble_ratio
    headless = replace(SPEC, vocab=None)  # every stage alike: no rank waits for a heavier one
    even, _ = evaluate_setting(GPUS, _model(spec=headless), BATCH, FABRIC, layout, "interleaved-1f1b", 2, m, False)
    # equal busy times summed in another order: they differ by float rounding, about 1e-15
    assert even.pipeline_bubble == pytest.approx(even.candidate.bubble_ratio, abs=1e-12)
    assert row.to_json()["pipeline_bubble"] == row.pipeline_bubble


def test_fsdp_s_unsharded_gradients_placed_on_the_timeline_decide_the_fit_not_their_whole_count():
    # a GPU between the timeline's peak and the peak with every gradient counted at once: the
    # schedule storing its activations fits (as Llama 3 405B's published layout does). At m = p
    # interleaved runs every forward before its first backward: the activation peak comes
    # before any unsharded gradient exists
    layout = ParallelLayout(pp=4, dp_shard=2, tp=2)
    batch = 4 * layout.dp * SPEC.microbatch_size
    roomy, _ = evaluate_setting(GPUS, _model(), batch, FABRIC, layout, "interleaved-1f1b", 2, 4, False)
    placed = roomy.candidate.peak_memory_bytes
    fields = ("params", "grads", "optimizer", "gathered", "unsharded_grads", "buffers", "activations")
    whole = max(sum(rank[f] for f in fields) for rank in roomy.bytes_per_rank)
    assert placed < whole
    row, fits = evaluate_setting(GPUS, _model((placed + whole) / 2 / 1e9), batch, FABRIC, layout,
                                 "interleaved-1f1b", 2, 4, False)
    assert fits and row.candidate.recompute == "none" and row.candidate.peak_memory_bytes == placed


def test_the_scale_benchmark_s_small_case_searches_every_layout_and_keeps_the_published_one(monkeypatch):
    # benchmarks/advise_scale.py's smallest case, as the suite's one run of it (the 1T and 405B
    # cases are timed in benchmarks/RESULTS.md)
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "advise_scale.py"
    spec = importlib.util.spec_from_file_location("advise_scale", path)
    scale = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "advise_scale", scale)  # its dataclasses look their module up
    spec.loader.exec_module(scale)
    out = scale.run_case("small")
    assert out.published is not None and out.published.candidate.fits and not out.published_verdict
    assert out.searched > 0 and out.slower > 0 and out.priced >= out.searched
    assert out.pick.step_time <= out.published.step_time
