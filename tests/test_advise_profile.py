"""Advice from measured costs: profile real ranks, rank the schedules, train with the choice
(through the console script on a Hugging Face model: tests/test_hf_cli.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipesched import build_schedule, simulate  # noqa: E402
from pipesched.advise.search import NoCandidateFitsError  # noqa: E402
from pipesched.training.profile import (  # noqa: E402
    FITTED,
    advise_from_profile,
    fitted_cost,
    profile,
)

SMALL = dict(blocks=4, dim=32, hidden=64)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_profile_measures_every_stage_and_advice_respects_the_model_and_byte_limits():
    prof = profile("mlp", 2, 4, 16, steps=3, model_size=SMALL)
    assert len(prof.stage_costs) == 2 and all(t > 0 for c in prof.stage_costs for t in c)
    costs = prof.costs()
    assert costs.stage_multipliers == pytest.approx(
        [sum(c) / (sum(map(sum, prof.stage_costs)) / 2) for c in prof.stage_costs]
    )
    # the stage overhead (from zb-v, 2 chunks) and a fused backward's cost (from 1f1b): each fitted
    # so that the simulator's step of that layout over zb-h1's is the ratio measured, or at a bound
    # of its range where the measured ratio lies beyond it
    one = build_schedule("zb-h1", 2, 4)
    assert costs.stage_overhead == pytest.approx(1e3 * prof.stage_overhead)
    assert costs.full_backward == pytest.approx(1e3 * prof.full_backward)
    for name, chunks, field_name in FITTED:
        other, ratio = build_schedule(name, 2, 4, chunks), prof.ratios[name]
        simulated = simulate(other, costs).makespan / simulate(one, costs).makespan
        if simulated != pytest.approx(ratio, rel=1e-6):  # clamped: a ratio further out changes nothing
            beyond = ratio * (0.9 if simulated > ratio else 1.1)
            assert fitted_cost(one, other, costs, field_name, beyond) == pytest.approx(getattr(costs, field_name))
    assert f"stage overhead {costs.stage_overhead:.3f} ms" in prof.summary()
    assert f"full backward {costs.full_backward:.2f} ms" in prof.summary()
    advice = advise_from_profile(prof, memory_limit=2)
    assert all(c.chunks <= prof.max_chunks for c in advice.candidates)
    assert all(c.costs.stage_overhead == costs.stage_overhead for c in advice.candidates)
    assert all(c.costs.full_backward == costs.full_backward for c in advice.candidates)
    assert advice.recommended.fits
    keep, stash, boundary = prof.activation()
    assert 0 < boundary < keep and 0 < stash <= keep  # measured by the runtime on the first step
    # a limit in bytes: recomputation becomes a choice, taken only when nothing stored fits
    roomy = advise_from_profile(prof, limit_bytes=100 * keep)
    assert roomy.recommended.recompute == "none" and roomy.recommended.peak_memory_bytes <= 100 * keep
    tight = advise_from_profile(prof, limit_bytes=0.8 * keep / 2)  # under one microbatch of a rank's share
    assert tight.recommended.recompute == "all" and tight.recommended.peak_memory_bytes <= 0.8 * keep / 2
    with pytest.raises(NoCandidateFitsError, match="the leanest"):
        advise_from_profile(prof, limit_bytes=keep / 1000)


def test_profile_refuses_bad_input_in_one_line(cli):
    out = cli("advise", "--profile", "--ranks", "2", "--microbatches", "8", "--costs", "1,1,1")
    assert out.returncode == 2 and "--profile measures the costs itself: drop --costs" in out.stderr
