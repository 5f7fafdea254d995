"""Checkpoints: complete or absent, loadable into another layout, refused for another model; and
weights that turn NaN or infinite stop the run, naming the step and the parameter, unsaved."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from runtime_cases import CHECKPOINT_MODEL, checkpoint_crash_run, nonfinite_weights_run  # noqa: E402

import pipesched  # noqa: E402
from pipesched.runtime.checkpoints import checkpoint
from pipesched.runtime.guard import NonFiniteWeights  # noqa: E402
from pipesched.runtime.launching.launch import DistributedRunError, spawn  # noqa: E402
from pipesched.training.models import get_model  # noqa: E402
from pipesched.training.train import (  # noqa: E402
    TrainConfig,
    make_optimizer,
    train_reference,
)

pytestmark = pytest.mark.torch


def _reference(steps: int, **options) -> dict:
    options = {"lr": 0.01, "optimizer": "adamw", **options}
    cfg = TrainConfig("mlp", None, steps, 8, model_size=CHECKPOINT_MODEL, want_params=True, **options)
    return train_reference(cfg).params


def test_the_reference_run_resumed_from_a_checkpoint_ends_bitwise_equal(tmp_path):
    whole = _reference(4)
    _reference(2, checkpoint_dir=str(tmp_path), checkpoint_every=1)
    assert [p.name for p in checkpoint.complete_checkpoints(tmp_path)] == ["step-000001", "step-000002"]
    resumed = _reference(4, resume_from=str(checkpoint.latest(tmp_path)))
    assert all(torch.equal(resumed[k], whole[k]) for k in whole)


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    _reference(5, checkpoint_dir=str(tmp_path), checkpoint_every=2, checkpoint_keep=2)
    assert [p.name for p in checkpoint.complete_checkpoints(tmp_path)] == ["step-000004", "step-000005"]


def test_a_checkpoint_of_another_model_or_optimizer_is_refused_in_one_line(tmp_path):
    _reference(1, checkpoint_dir=str(tmp_path))
    path = checkpoint.latest(tmp_path)
    wider = get_model("mlp", blocks=3, dim=8, hidden=32)
    model = wider.sequential(0)
    with pytest.raises(checkpoint.CheckpointMismatch, match=r"another model: '0.fc1.weight' is \[16, 8\] there, \[32, 8\] here"):
        checkpoint.load(path, model, make_optimizer("adamw", 0.01)(list(model.parameters())))
    same = get_model("mlp", **CHECKPOINT_MODEL).sequential(0)
    with pytest.raises(checkpoint.CheckpointMismatch, match="another optimizer"):
        checkpoint.load(path, same, make_optimizer("sgd", 0.01)(list(same.parameters())))


def test_nan_weights_stop_the_reference_at_step_1_and_nothing_is_saved(tmp_path):
    with pytest.raises(NonFiniteWeights, match=r"^step 1: the optimizer step made parameter 0.norm.weight non-finite"):
        _reference(3, lr=math.nan, optimizer="sgd", checkpoint_dir=str(tmp_path), checkpoint_every=1)
    assert checkpoint.latest(tmp_path) is None


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["1f1b", "zb-v"])
def test_nan_weights_stop_every_rank_naming_step_and_first_parameter(name):
    schedule = pipesched.build_schedule(name, 2, 4)
    with pytest.raises(DistributedRunError) as err:
        spawn(nonfinite_weights_run, 2, schedule, timeout_s=60)
    assert str(err.value) == (
        "ranks 0, 1: step 1: the optimizer step made parameter 0.norm.weight non-finite (NaN or inf); "
        "stopped before saving anything of it (lower --lr, or clip with --clip-grad-norm)"
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_crash_while_writing_a_checkpoint_leaves_the_previous_one_loadable(tmp_path):
    schedule = pipesched.build_schedule("zb-v", 2, 4)
    with pytest.raises(DistributedRunError, match=r"rank 1 died \(killed by signal 9\)"):
        spawn(checkpoint_crash_run, 2, (str(tmp_path), schedule), timeout_s=30)
    assert [p.name for p in checkpoint.complete_checkpoints(tmp_path)] == ["step-000001"]
    assert (tmp_path / ".step-000002.partial").is_dir()  # what the crash left: never listed
    # the 2-rank pipeline's checkpoint loads into the one-process model (another layout)
    md = get_model("mlp", **CHECKPOINT_MODEL)
    model = md.sequential(0)
    optimizer = make_optimizer("adamw", 0.01)(list(model.parameters()))
    assert checkpoint.load(checkpoint.latest(tmp_path), model, optimizer) == 1
    after_one_step = _reference(1)
    for name, value in model.state_dict().items():
        assert torch.allclose(value, after_one_step[name], rtol=1e-5, atol=1e-7), name
    assert optimizer.state[model[0].fc1.weight]["step"] == 1


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_dualpipe_saves_one_model_copy_and_loads_it_into_both(tmp_path):
    from runtime_cases import copies_checkpoint_run

    schedule = pipesched.build_schedule("dualpipe", 2, 2)
    whole, resumed = spawn(copies_checkpoint_run, 2, (str(tmp_path), schedule), timeout_s=120)[0]
    # each rank holds both model stages (one of each copy), under the unpipelined names
    assert [sorted(part) for part in whole] == [sorted(whole[0])] * 2
    for parts in (whole, resumed):  # the two copies of every parameter stay bitwise equal
        assert all(torch.equal(parts[0][name], parts[1][name]) for name in parts[0])
    assert all(torch.equal(resumed[0][name], whole[0][name]) for name in whole[0])
    # the checkpoint holds one copy, the unpipelined model's: the reference resumes from it
    saved = checkpoint.saved_entries(checkpoint.latest(tmp_path))
    assert sorted(k for k in saved if k.startswith("model.")) == sorted(f"model.{name}" for name in _reference(0))
    reference = _reference(4, resume_from=str(checkpoint.latest(tmp_path)))
    want = _reference(4)
    assert all(torch.allclose(reference[k], want[k], rtol=0, atol=1e-6) for k in want)
    assert all(torch.allclose(whole[0][k], want[k], rtol=0, atol=1e-5) for k in whole[0])
