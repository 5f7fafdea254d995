"""Generated hostile Hugging Face configs and checkpoint manifests through the console script's
entry point (issue 31; generators in :mod:`fuzz_hf_cases`, seeded): every config is refused in
one line, exit 2, within 10 s, or trains (exit 0); every manifest makes ``checkpoint verify``
say, in one line per step, that the step is damaged and why, at once. None is a traceback, a
wait, or a long message. Each set runs in one process (:func:`fuzz_cases.run_batch`), so a case
costs what pipesched does for it, not a Python start.
"""

from __future__ import annotations

import json

import pytest

from fuzz_cases import problems, run_batch
from fuzz_hf_cases import TINY, config_cases, manifest_cases

CONFIGS = 500
MANIFESTS = 120
REFUSED_WITHIN_S = 10.0


@pytest.mark.torch
@pytest.mark.timeout(280)
def test_generated_hf_configs_are_refused_in_one_line_or_trained(tmp_path):
    pytest.importorskip("transformers")
    warm = tmp_path / "warm.json"
    warm.write_text(json.dumps({"model_type": "llama", **TINY}))
    warm_up = ["train", "--model", f"hf:{warm}", "-s", "none", "--steps", "1", "--batch-size", "2"]
    # the warm-up pays the imports of torch and transformers, once; its outcome is not counted
    outcomes = run_batch([warm_up, *config_cases(CONFIGS, seed=31, folder=tmp_path)], tmp_path, bound_s=60)[1:]
    failures = [p for o in outcomes for p in problems(o)]
    failures += [f"{o.argv[2]}: refused after {o.seconds:.1f} s" for o in outcomes
                 if o.code == 2 and o.seconds > REFUSED_WITHIN_S]
    assert not failures, "\n".join(failures[:20])
    trained = sum(o.code == 0 for o in outcomes)
    assert 0 < trained < CONFIGS // 10  # a few train; the rest are refused
    said = "".join(o.stderr for o in outcomes if o.code == 2)
    for reason in ("must be a whole number", "must be from", "nested too deep", "parameters need", "cannot use the model "
                   "config", "cannot split a"):  # refused for many reasons, each where it is found
        assert reason in said, reason


def test_generated_manifests_make_verify_name_the_damage_at_once(tmp_path):
    outcomes = run_batch(manifest_cases(MANIFESTS, seed=31, folder=tmp_path), tmp_path, bound_s=5)
    for outcome in outcomes:
        assert outcome.code == 1 and not outcome.stderr, outcome
        lines = outcome.stdout.splitlines()
        assert len(lines) == 1 and lines[0].startswith("step-000003: damaged: ") and len(lines[0]) < 6000, outcome
        assert outcome.seconds < 5, outcome
