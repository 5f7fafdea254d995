"""``--lr-schedule``, ``--warmup``, ``--min-lr``, ``--weight-decay``: every step trains at the closed
form's rate, a resumed run continues with the uninterrupted run's rates and weights bitwise, and
weight decay reaches exactly the parameters the transformers Trainer decays."""

from __future__ import annotations

import math
import sys

import pytest
from conftest import concurrently, run_cli

torch = pytest.importorskip("torch")

from pipesched.runtime.checkpoints import checkpoint
from pipesched.training.loop_options import LoopOptions  # noqa: E402
from pipesched.training.optimizers import make_optimizer  # noqa: E402
from pipesched.training.train import TrainConfig, train_reference  # noqa: E402

pytestmark = pytest.mark.torch

LR, MIN_LR, STEPS, WARMUP = 0.02, 0.002, 8, 3
SMALL_MLP = {"blocks": 2, "dim": 8, "hidden": 16}
# LambdaLR multiplies the peak rate by rate/peak: one division and one product, each rounded once
RATE_REL = 4 * sys.float_info.epsilon


def closed_form(kind: str, step: int) -> float:
    """The rate of ``step``: ramp (s+1)/(W+1), then from LR at step W to MIN_LR at the last step."""
    if step < WARMUP:
        return LR * (step + 1) / (WARMUP + 1)
    progress = (step - WARMUP) / (STEPS - 1 - WARMUP)
    if kind == "cosine":
        return MIN_LR + (LR - MIN_LR) * (1 + math.cos(math.pi * progress)) / 2
    if kind == "linear":
        return MIN_LR + (LR - MIN_LR) * (1 - progress)
    return LR


def config(kind: str, **extra) -> TrainConfig:
    loop = LoopOptions(lr_schedule=kind, warmup=WARMUP, min_lr=MIN_LR)
    return TrainConfig("mlp", None, STEPS, 8, lr=LR, optimizer="adamw", model_size=SMALL_MLP, loop=loop,
                       want_params=True, **extra)


@pytest.mark.parametrize("kind", ["constant", "cosine", "linear"])
def test_every_step_trains_at_the_closed_form_rate(kind):
    rates = train_reference(config(kind)).loop.lrs
    assert rates == pytest.approx([closed_form(kind, s) for s in range(STEPS)], rel=RATE_REL, abs=0)
    if kind != "constant":  # the decay ends at the minimum on the last step
        assert rates[-1] == pytest.approx(MIN_LR, rel=RATE_REL)
    assert rates[WARMUP] == pytest.approx(LR, rel=RATE_REL)  # the peak right after the warm-up


def test_a_resumed_run_continues_with_the_same_rates_and_weights_bitwise(tmp_path):
    whole = train_reference(config("cosine"))
    train_reference(config("cosine", checkpoint_dir=str(tmp_path), checkpoint_every=3, checkpoint_keep=3))
    resumed = train_reference(config("cosine", resume_from=str(checkpoint.step_dir(tmp_path, 3))))
    assert resumed.first_step == 3
    assert resumed.loop.lrs == whole.loop.lrs[3:]  # the same computation: bitwise
    for name, value in whole.params.items():
        assert torch.equal(resumed.params[name], value), name


def test_weight_decay_reaches_the_parameters_the_transformers_trainer_decays():
    pytest.importorskip("transformers")
    from hf_cases import make_model
    from transformers import Trainer

    for kind in ("llama", "gpt2", "mixtral"):
        model = make_model(kind, dtype=torch.float32)
        optimizer = make_optimizer("adamw", LR, weight_decay=0.1)(list(model.parameters()))
        decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0.1 for p in g["params"]}
        names = Trainer.get_decay_parameter_names(None, model)  # uses nothing of the Trainer but the model
        trainer = {id(model.get_parameter(n)) for n in names}
        assert decayed == trainer, kind
        assert all(g["weight_decay"] == 0.0 for g in optimizer.param_groups if g["weight_decay"] != 0.1)


def test_bad_schedule_options_are_one_line_and_exit_2():
    rows = [
        (["--lr-schedule", "step"], "--lr-schedule 'step' is not known: use one of constant, cosine, linear"),
        (["--warmup", "10", "--steps", "10"], "--warmup must be from 0 to below --steps (10), got 10"),
        (["--min-lr", "0.5", "--lr", "0.1"], "--min-lr must be from 0 to --lr (0.1), got 0.5"),
        (["--weight-decay", "nan"], "--weight-decay must be from 0 to below 1, got nan"),
    ]
    for (args, message), result in zip(rows, concurrently(lambda row: run_cli("train", *row[0]), rows)):
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.strip() == f"pipesched: error: {message}", args
