"""Dropout and router noise that do not depend on the schedule: draws keyed by (seed, step,
microbatch, block).

A pipeline runs block ``b``'s forward for microbatch ``k`` when its schedule says, on the rank
that holds ``b``, and once more inside a backward when it recomputes. Drawn from each rank's
generator in that order, a dropout mask (GPT-2's ``resid_pdrop``, Llama's ``attention_dropout``)
or Mixtral's router jitter (``router_jitter_noise``) would depend on the schedule, the rank count
and the split: the same seed would train other weights under 1f1b and zb-v. Instead every block's
forward draws from the generator seeded with a hash of ``(seed, step, first sample of the
microbatch, block index)``, and the generator's state is restored after it: a block draws the
same numbers for the same microbatch of the same step wherever and whenever it runs, so the
draws are those of :func:`pipesched.hf.one_process_step` (the model's blocks run microbatch by
microbatch in one process, keyed the same) under every schedule and rank count, and under every
``dp`` that splits the batch into the same microbatches (``m * dp`` of them).

The key travels as a batch context entry (:mod:`pipesched.runtime.stages.batch_context`): a
``[batch, 3]`` tensor of ``(seed, step, sample index)`` the runtime cuts into microbatches and
replicas with the batch, so each microbatch's first row names it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

KEY = "random_key"
_MASK = (1 << 64) - 1


def step_key(batch_size: int, seed: int, step: int) -> torch.Tensor:
    """The ``[batch_size, 3]`` key of one step: ``(seed, step, sample index)`` per sample."""
    key = torch.empty(batch_size, 3, dtype=torch.int64)
    key[:, 0], key[:, 1] = seed, step
    key[:, 2] = torch.arange(batch_size)
    return key


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def draw_seed(*key: int) -> int:
    """A generator seed from integers (splitmix64, the same on every platform and Python)."""
    state = 0
    for value in key:
        state = _splitmix64(state ^ (value & _MASK))
    return state >> 1  # manual_seed takes up to 2**63 - 1


@contextmanager
def keyed_draws(context: dict, block: int, like: torch.Tensor) -> Iterator[None]:
    """Within it, ``like``'s device draws as block ``block`` of the microbatch of ``context``;
    the generators' state is restored after. Without a key (shape inference, a model called
    outside a pipeline step) the draws are left as they are."""
    key = context.get(KEY)
    if key is None or like.is_meta:
        yield
        return
    seed = draw_seed(*key[0].tolist(), block)
    cuda = like.device.type == "cuda"
    with torch.random.fork_rng(devices=[like.device.index or 0] if cuda else [], device_type="cuda"):
        torch.default_generator.manual_seed(seed)
        if cuda:
            torch.cuda.default_generators[like.device.index or 0].manual_seed(seed)
        yield


def random_settings(config) -> list[str]:
    """The config's settings that make a forward draw (dropout, router jitter) and are not zero:
    ``["resid_pdrop=0.1", ...]``. ``summary_*`` and ``classifier_*`` belong to a classification
    head (GPT-2's sequence summary; GPT-NeoX's and Falcon's token classifiers, whose configs set
    ``classifier_dropout=0.1``), never run here."""
    found = []
    for name, value in sorted(vars(config).items()):
        drawing = name.endswith(("dropout", "pdrop", "jitter_noise")) and not name.startswith(("summary_", "classifier_"))
        if drawing and isinstance(value, (int, float)) and value > 0:
            found.append(f"{name}={value}")
    return found
