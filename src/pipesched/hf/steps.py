"""What a model's ``forward`` does between its parts, each a named step done as the model does it.

Most decoders run their parts in order: embeddings, layers, final norm, head. Some do a little
more in the base model's or the causal LM's ``forward``, which no part holds: Granite multiplies
the embeddings by ``embedding_multiplier`` and divides the logits by ``logits_scaling``, Cohere
multiplies the logits by ``logit_scale``, Gemma 2 and 3 soft-cap them
(``tanh(logits / cap) * cap``), StarCoder2 applies dropout to the embeddings. A family declares
these (:mod:`.architectures`), the embedding and head blocks apply them (:mod:`.blocks`), and the
twin check (:mod:`.twin`) verifies the declaration against the model's own ``forward``.
Each step computes exactly the model's operations in the model's order, so that a split model
equals the model to the last bit, not only in exact arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.nn import functional as F


@dataclass(frozen=True)
class Step:
    """One operation of a model's ``forward`` outside its parts: ``apply(tensor, config, training)``."""

    name: str
    apply: Callable[[torch.Tensor, object, bool], torch.Tensor]


def multiply(field: str) -> Step:
    """``x * config.<field>`` (Granite's embedding multiplier, Cohere's logit scale)."""
    return Step(f"x * config.{field}", lambda x, config, training: x * getattr(config, field))


def divide(field: str) -> Step:
    """``x / config.<field>`` (Granite's logits scaling)."""
    return Step(f"x / config.{field}", lambda x, config, training: x / getattr(config, field))


def softcap(field: str) -> Step:
    """``tanh(x / cap) * cap`` with ``cap = config.<field>``, nothing when it is None (Gemma 2, 3)."""

    def apply(x: torch.Tensor, config, training: bool) -> torch.Tensor:
        cap = getattr(config, field)
        if cap is None:
            return x
        return torch.tanh(x / cap) * cap

    return Step(f"tanh(x / config.{field}) * config.{field}", apply)


def dropout(field: str) -> Step:
    """``dropout(x, p=config.<field>)`` while training (StarCoder2's embedding dropout)."""
    return Step(f"dropout(x, config.{field})",
                lambda x, config, training: F.dropout(x, p=getattr(config, field), training=training))
