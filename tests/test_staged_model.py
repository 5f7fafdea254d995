"""A model's facts travel with its blocks (StagedModel), the run's knobs with RuntimeOptions.

The older ways of passing them (the positional ``PipelineRuntime(build_block, num_blocks,
schedule, loss_fn, optimizer, sample_input)`` and the facts given to ``RuntimeOptions``) still
give the runtime the same model, with a DeprecationWarning; a fact given twice is refused.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from pipesched.errors import ConfigError  # noqa: E402
from pipesched.runtime import RuntimeOptions, StagedModel  # noqa: E402
from pipesched.runtime.options import runtime_arguments  # noqa: E402

SAMPLE = torch.zeros(2, 4)
TIED = (("0.weight", "3.weight"),)


def build_block(i: int) -> torch.nn.Module:
    return torch.nn.Linear(4, 4)


def loss_fn(y, t):
    return (y - t).pow(2).mean()


def optimizer(params):
    return torch.optim.SGD(params, lr=0.1)


def test_a_staged_model_is_given_as_it_is_and_the_options_keep_their_knobs():
    model = StagedModel(build_block, 4, SAMPLE, block_counts=(1, 3), tied=TIED)
    options = RuntimeOptions(seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert runtime_arguments(model, "schedule", loss_fn, optimizer, (), options) == (
            model, "schedule", loss_fn, optimizer, options)
    assert model.stage_ranges(2) == [range(0, 1), range(1, 4)]


def test_the_older_positional_form_builds_the_same_model_and_warns():
    with pytest.warns(DeprecationWarning, match="pass StagedModel"):
        model, schedule, loss, opt, _ = runtime_arguments(build_block, 4, "schedule", loss_fn, (optimizer, SAMPLE),
                                                          RuntimeOptions())
    assert (model.build_block, model.num_blocks, model.sample_input) == (build_block, 4, SAMPLE)
    assert (schedule, loss, opt) == ("schedule", loss_fn, optimizer)


def test_facts_given_to_the_options_move_onto_the_model_and_warn():
    options = RuntimeOptions(seed=7, block_counts=(1, 3), tied=TIED, tp_plan={"0": "colwise"})
    with pytest.warns(DeprecationWarning, match="block_counts, tied, tp_plan"):
        model, _, _, _, knobs = runtime_arguments(StagedModel(build_block, 4, SAMPLE), "s", loss_fn, optimizer, (),
                                                  options)
    assert (model.block_counts, model.tied, model.tp_plan) == ((1, 3), TIED, {"0": "colwise"})
    assert knobs == RuntimeOptions(seed=7) and knobs.model_facts == {}  # the runtime's options hold knobs only


def test_a_fact_given_to_both_the_model_and_the_options_is_refused():
    with pytest.raises(ConfigError, match="tied given twice"):
        runtime_arguments(StagedModel(build_block, 4, SAMPLE, tied=TIED), "s", loss_fn, optimizer, (),
                          RuntimeOptions(tied=TIED))


@pytest.mark.parametrize("tied, refusal", [
    ((("0.weight",),), "two or more distinct parameters"),
    ((("0.weight", "0.weight"),), "two or more distinct parameters"),
    ((("0.weight", "3.weight"), ("3.weight", "1.weight")), "named in two tied groups"),
])
def test_tied_groups_that_name_no_pair_of_weights_are_refused(tied, refusal):
    with pytest.raises(ConfigError, match=refusal):
        StagedModel(build_block, 4, SAMPLE, tied=tied)
