"""The loss Hugging Face computes for a causal LM, normalised once for the whole step.

``ForCausalLMLoss`` is the shifted cross-entropy (labels ``-100`` ignored), summed over the
tokens and divided by the number of counted tokens. A pipeline computes it per microbatch, and
microbatches of a padded batch hold different numbers of counted tokens, so a mean of
per-microbatch means is not the batch's loss. The runtime scales every microbatch's loss by
``1/m`` and averages the ``dp`` replicas, so each microbatch's loss is its token sum times
``m * dp / N`` (``N``: counted tokens of the whole global batch, known on every rank before the
step): the runtime's mean then is exactly ``sum / N``, the loss and gradients of the model on
the whole batch.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100


def counted_tokens(labels: torch.Tensor) -> int:
    """Tokens the loss counts: every label after the first of its row that is not ``-100``."""
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


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

        return ForCausalLMLoss(logits, labels, self.vocab_size, num_items_in_batch=self.items_per_microbatch)
