"""How the documents packed into one sequence see each other (``--packing``).

A token stream holds its documents one after another, each ended by an end-of-sequence token
(:mod:`.tokenize_text`), and a sample is a window of ``--seq-len`` tokens of it, so a window
may hold the end of one document and the start of the next.

- ``across`` (the default): the window is one sequence; attention runs across the separator
  and positions count from the window's start (nanoGPT's and GPT-2's pre-training).
- ``documents``: every document in the window is its own sequence: position ids restart at 0
  after every end-of-sequence token (and at the window's start), and attention is causal inside
  each document only (block-diagonal). The position ids are the whole mechanism: the model's
  layers build their mask with transformers' ``create_causal_mask``, which reads a restart of
  the position ids as a document boundary (its packed-sequence format) and masks across it, so
  each document's logits are the ones it has alone (``tests/test_packing.py``). Every token
  still has its label: the separator's logits predict the next document's first token, from its
  own document alone (Megatron's ``--reset-position-ids --reset-attention-mask`` without
  ``--eod-mask-loss``), so every microbatch counts the same tokens and the mean of their losses
  stays the batch's.

The ids of the end-of-sequence token are the tokenizer's (when the data went through one) or
else the model config's ``eos_token_id`` (one id or a list): :func:`.tokenize_text.document_end`,
the rule tokenization writes the separator by.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import ConfigError
from .tokenize_text import document_end

PACKINGS = ("across", "documents")


def check_packing(value: str) -> None:
    """ConfigError (one line) unless ``value`` is one of :data:`PACKINGS`."""
    if value not in PACKINGS:
        raise ConfigError(f"--packing {value!r} is not one of {', '.join(PACKINGS)}")


def document_positions(ids: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """Position ids of a batch of windows ``ids`` (batch, length) whose documents end with one of
    the ids ``eos``: 0 at each row's start and after each end-of-sequence token, then counting."""
    index = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    starts = torch.zeros_like(ids, dtype=torch.bool)
    starts[:, 1:] = torch.isin(ids[:, :-1], eos.to(ids.device))
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values  # the document's first index
    return index - first


def eos_ids(tokenizer_eos: Optional[int], config_eos, flag: str, vocab_size: int) -> torch.Tensor:
    """The ids that end a document: the tokenizer's (``tokenizer_eos``, when the data went through
    one) else the config's ``eos_token_id``; ConfigError, naming ``flag``, when there is none or
    one can never match a token of a vocabulary of ``vocab_size`` (``[]``, ``-1``, an id beyond
    it, a string): the run would otherwise train on windows with no document boundary, silently."""
    chosen, source = document_end(tokenizer_eos, config_eos)
    if tokenizer_eos is None and config_eos is None:
        raise ConfigError(f"--packing documents: {flag} has no end-of-sequence id to find documents by "
                          "(no tokenizer eos_token and no eos_token_id in the config): use --packing across")
    never = [i for i in chosen if type(i) is not int or not 0 <= i < vocab_size]
    if not chosen or never:
        what = "is an empty list" if not chosen else f"holds {never[0]!r:.40}"
        raise ConfigError(f"--packing documents: {source} {what}, which matches no token id of the vocabulary "
                          f"(0 to {vocab_size - 1}): no document would ever end; fix it or use --packing across")
    return torch.tensor(list(chosen), dtype=torch.long)
