"""``pipesched train --model hf:CONFIG.json``: a Hugging Face causal LM as one of train's models.

The model is its blocks (:mod:`.blocks`, each built from the config on the rank that owns it,
randomly initialised, block ``i`` after ``torch.manual_seed(seed + i)``, or read from
``--hf-weights DIR``), trained on windows of a token stream: ``--data FILE`` read as bytes (each
byte a token id, modulo the vocabulary) or a ``.npy`` array of token ids, by default the text
shipped with pipesched. The labels are the windows themselves (the model shifts them), so every
token counts and the mean loss of equal microbatches is the model's loss on the whole batch.
Every mistake (a config it cannot read or split, or that draws: dropout, router noise, which
only :func:`pipesched.hf.pipeline` keys so that the schedule does not change them; weights that
do not match it, token ids beyond the vocabulary) is a one-line ConfigError raised here, before
any rank starts.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

import torch

from ..errors import ConfigError
from ..runtime.model_def import ModelDef
from .build import BlockSource
from .config_file import read_config
from .pipeline import model_name, tied_groups
from .randomness import random_settings
from .split import block_costs
from .token_data import TokenStream, token_stream as read_tokens

PREFIX = "hf:"
DEFAULT_CONTEXT = 64  # tokens per sample, or the model's positions if fewer


@lru_cache(maxsize=4)
def token_stream(data: Optional[str], vocab_size: int) -> TokenStream:
    """The training tokens (:mod:`.token_data`: mapped from a regular file, in bounded memory)."""
    return read_tokens(data, vocab_size)


def hf_model_def(config_path: str, data: Optional[str] = None, weights: Optional[str] = None,
                 context: Optional[int] = None) -> ModelDef:
    """The ModelDef of ``--model hf:CONFIG.json`` (see the module's docstring)."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    config = read_config(config_path)
    drawing = random_settings(config)
    if drawing:
        raise ConfigError(f"--model {PREFIX}{config_path} draws ({', '.join(drawing)}), which train cannot key: "
                          "set them to 0 in the config, or train with pipesched.hf.pipeline, whose dropout and "
                          "router noise do not depend on the schedule")
    source = BlockSource(config, weights, weights_argument="--hf-weights {!r}")
    vocab = config.vocab_size
    limit = getattr(config, "max_position_embeddings", None) or DEFAULT_CONTEXT
    context = context or min(DEFAULT_CONTEXT, limit)
    stream = token_stream(data, vocab)
    if len(stream) <= context:
        raise ConfigError(f"--data: {len(stream)} tokens, too few for samples of {context}")

    def batch(step: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1_000_003 * seed + step)
        starts = torch.randint(0, len(stream) - context, (size,), generator=g)
        ids = stream.windows(starts, context)
        return ids, ids

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return ForCausalLMLoss(logits, labels, vocab)

    blocks = [source.meta_block(i) for i in range(source.num_blocks)]
    costs = tuple(block_costs(blocks, config, context))
    return ModelDef(f"{PREFIX}{config_path}", source.num_blocks, source, loss, batch, costs, tied_groups(source),
                    checkpoint_name=model_name)
