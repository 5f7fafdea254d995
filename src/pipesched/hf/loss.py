"""The loss Hugging Face computes for a causal LM, normalised once for the whole step.

``ForCausalLMLoss`` is the shifted cross-entropy (labels ``-100`` ignored), summed over the
tokens and divided by the number of counted tokens. A pipeline computes it per microbatch, and
microbatches of a padded batch hold different numbers of counted tokens, so a mean of
per-microbatch means is not the batch's loss. The runtime scales every microbatch's loss by
``1/m`` and averages the ``dp`` replicas, so each microbatch's loss is its token sum times
``m * dp / N`` (``N``: counted tokens of the whole global batch, known on every rank before the
step): the runtime's mean then is exactly ``sum / N``, the loss and gradients of the model on
the whole batch.

Exactly, not only in exact arithmetic: the cross-entropy is computed in float32 whatever the
model's dtype (``logits.float()``), and its backward weighs every counted token by the gradient
it receives. The model on the whole batch gives each token ``fl32(1/N)``. Scaling in float32 (the
sum by ``1/(N/m)``, then by the runtime's ``1/m``) gives ``fl32(fl32(1/m) / fl32(N/m))``, which for
``m = 3`` differs from ``fl32(1/N)`` for a third of the ``N`` below 2000: a float32 rounding in
every gradient of a float64 model. So the token sum leaves float32 first and is scaled in
float64, where the gradient reaching it is ``1/N`` within float64's rounding; ``1/N`` is never
that close to a float32 rounding boundary (its distance from one is at least ``2^-25 / N``
relative), so float32 rounds it to ``fl32(1/N)`` for every ``m``. (With ``dp`` replicas the
token weight is ``fl32(dp/N)`` and the average divides the gradients by ``dp`` in the model's
dtype: exact where ``dp`` is a power of two.)
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100


def counted_tokens(labels: torch.Tensor) -> int:
    """Tokens the loss counts: every label after the first of its row that is not ``-100``."""
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


def _widest(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in float64 where its device has float64 (MPS has not: float32 there)."""
    return tensor if tensor.device.type == "mps" else tensor.double()


class StepNormalisedLoss:
    """``loss_fn(logits, labels)`` for the runtime: a microbatch's token sum over the step's
    per-microbatch share of the counted tokens (set by :meth:`start_step` before each step)."""

    def __init__(self, vocab_size: int, microbatches: int, replicas: int) -> None:
        self.vocab_size = vocab_size
        self.shares = microbatches * replicas
        self.items_per_microbatch = 1.0

    def start_step(self, labels: torch.Tensor) -> None:
        """Normalise the coming step by the counted tokens of its whole (global) batch."""
        self.items_per_microbatch = counted_tokens(labels) / self.shares

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from transformers.loss.loss_utils import ForCausalLMLoss

        token_sum = ForCausalLMLoss(logits, labels, self.vocab_size, num_items_in_batch=1)  # x / 1: exact
        return _widest(token_sum) / self.items_per_microbatch
