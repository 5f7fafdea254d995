"""Advice from measured costs: profile real ranks, rank the schedules, train with the choice."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from pipesched.runtime.models import get_model  # noqa: E402
from pipesched.runtime.profile import activation_bytes, advise_from_profile, profile  # noqa: E402

SMALL = dict(blocks=4, dim=32, hidden=64)


def test_activation_bytes_grow_with_the_microbatch_and_exclude_parameters():
    md = get_model("mlp", **SMALL)
    one = activation_bytes(md, 2, 4)
    two = activation_bytes(md, 2, 8)
    assert all(x > 0 for x in one)
    assert two == pytest.approx([2 * x for x in one], rel=0.1)
    params = sum(p.numel() * 4 for p in md.sequential(0).parameters())
    assert sum(activation_bytes(md, 1, 1)) < params  # one sample's activations, far below the weights


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_profile_measures_every_stage_and_advice_respects_the_model():
    prof = profile("mlp", 2, 4, 16, steps=3, model_size=SMALL)
    assert len(prof.stage_costs) == 2 and all(t > 0 for c in prof.stage_costs for t in c)
    costs = prof.costs()
    assert costs.stage_multipliers == pytest.approx(
        [sum(c) / (sum(map(sum, prof.stage_costs)) / 2) for c in prof.stage_costs]
    )
    advice = advise_from_profile(prof, memory_limit=2)
    assert all(c.chunks <= prof.max_chunks for c in advice.candidates)
    assert advice.recommended.fits


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cli_profile_and_train_auto(cli):
    out = cli("advise", "--profile", "--ranks", "2", "--microbatches", "4", "--batch-size", "16",
              "--profile-steps", "2", "--memory-limit", "2", "--json", timeout=240)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows[0]["fits"] and rows[0]["peak_memory"] <= 2
    out = cli("train", "--model", "mlp", "--schedule", "auto", "--ranks", "2", "--microbatches", "4",
              "--batch-size", "16", "--steps", "2", "--memory-limit", "2", timeout=240)
    assert out.returncode == 0, out.stderr
    assert "auto:" in out.stderr and "fastest schedule within the limit" in out.stderr


def test_profile_refuses_bad_input_in_one_line(cli):
    out = cli("advise", "--profile", "--ranks", "2", "--microbatches", "8", "--costs", "1,1,1")
    assert out.returncode == 2 and "--profile measures the costs itself: drop --costs" in out.stderr
