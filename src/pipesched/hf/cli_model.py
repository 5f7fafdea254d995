"""``pipesched train --model hf:CONFIG.json`` (or ``hf:FOLDER``): a Hugging Face causal LM as
one of train's models.

The model is its blocks (:mod:`.blocks`, each built from the config on the rank that owns it,
randomly initialised, block ``i`` after ``torch.manual_seed(seed + i)``, or read from
``--hf-weights DIR``, which ``hf:FOLDER`` fills with the folder when it holds weights:
:mod:`pipesched.training.job.hf_model`), trained on windows of ``--seq-len`` tokens of a token stream
(:mod:`pipesched.data.streams`): ``--data`` a token file, text through the tokenizer of the
model's folder (or ``--tokenizer DIR``), or without one a file's bytes modulo the vocabulary;
by default the text shipped with pipesched; with ``--packing documents`` the batch context
restarts the position ids at every document (:mod:`pipesched.data.packing`). ``--eval-data``
or ``--eval-share`` holds out what :meth:`~pipesched.training.model_def.ModelDef.eval_batch`
reads. The labels are the windows themselves (the model shifts them), so every token counts
and the mean loss of equal microbatches is the model's loss on the whole batch.
Every mistake (a config it cannot read or split, or that draws: dropout, router noise, which
only :func:`pipesched.hf.pipeline` keys so that the schedule does not change them; weights that
do not match it, token ids beyond the vocabulary, a sequence longer than the model's positions)
is a one-line ConfigError raised here, before any rank starts.
"""

from __future__ import annotations

from functools import lru_cache, partial
from pathlib import Path
from typing import Optional

import torch

from ..data.packing import document_positions, eos_ids
from ..data.streams import TokenStream, eval_windows, open_stream, train_windows
from ..data.tokenize_text import find_tokenizer, load_tokenizer
from ..errors import ConfigError
from ..expert_plans import check_ep, expert_plan_for
from ..runtime.sharding.model_plans import plan_for
from ..training.model_def import ModelDef
from .build import BlockSource
from .config_file import model_folder, read_config
from .pipeline import head_counts, model_name, tied_groups
from .randomness import random_settings
from .split import block_costs
from .splitting import prepare_split_backward

PREFIX = "hf:"
DEFAULT_CONTEXT = 64  # tokens per sample, or the model's positions if fewer


@lru_cache(maxsize=4)
def token_stream(data: Optional[str], vocab_size: int, tokenizer: Optional[str] = None,
                 flag: str = "--data", config_eos=None) -> TokenStream:
    """The tokens of ``data`` (:func:`pipesched.data.streams.open_stream`; None: the shipped text),
    opened once per process; ``config_eos`` the config's ``eos_token_id`` (a list as a tuple)."""
    return open_stream(data, vocab_size, None if tokenizer is None else Path(tokenizer), flag, config_eos)


def hf_model_def(config_path: str, data: Optional[str] = None, weights: Optional[str] = None,
                 context: Optional[int] = None, tokenizer: Optional[str] = None, eval_data: Optional[str] = None,
                 eval_share: Optional[float] = None, packing: str = "across") -> ModelDef:
    """The ModelDef of ``--model hf:CONFIG.json`` or ``hf:FOLDER`` (see the module's docstring);
    ``tokenizer``: the folder of text data's tokenizer (default: the model's folder, where it holds
    tokenizer.json);
    ``packing``: whether a window's documents see each other (:mod:`pipesched.data.packing`)."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    config = read_config(config_path)
    prepare_split_backward()  # in every rank: GPT-2's Conv1D is a Linear to the tp styles and the split backward
    drawing = random_settings(config)
    if drawing:
        raise ConfigError(f"--model {PREFIX}{config_path} draws ({', '.join(drawing)}), which train cannot key: "
                          "set them to 0 in the config, or train with pipesched.hf.pipeline, whose dropout and "
                          "router noise do not depend on the schedule")
    own = weights is not None and Path(config_path).is_dir() and Path(weights) == Path(config_path)  # hf:FOLDER's
    named = f"the weights of {PREFIX}{{}}" if own else "--hf-weights {!r}"
    source = BlockSource(config, weights, weights_argument=named)
    vocab = config.vocab_size
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if context is not None and limit is not None and context > limit:
        raise ConfigError(f"--seq-len {context} is beyond the model's {limit} positions (max_position_embeddings)")
    context = context or min(DEFAULT_CONTEXT, limit or DEFAULT_CONTEXT)
    folder = find_tokenizer(tokenizer, model_folder(config_path))
    tokenizer = None if folder is None else str(folder)
    eos = getattr(config, "eos_token_id", None)
    eos = tuple(eos) if isinstance(eos, list) else eos  # token_stream's cache keys its arguments
    stream = token_stream(data, vocab, tokenizer, config_eos=eos)
    held_out = None
    if eval_data is not None:
        held_out = token_stream(eval_data, vocab, tokenizer, "--eval-data", eos)
    elif eval_share is not None:
        stream, held_out = stream.split(eval_share)
    for flag, part in (("--data", stream), ("--eval-data" if eval_data else "--eval-share", held_out)):
        if part is not None and len(part) <= context:
            raise ConfigError(f"{flag}: {len(part)} tokens, too few for samples of {context} (--seq-len)")

    side = _document_context(stream, held_out, folder, config) if packing == "documents" else None

    def batch(step: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = train_windows(stream, step, size, seed, context)
        return ids, ids

    def eval_batch(index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = eval_windows(held_out, index, size, context)
        return ids, ids

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return ForCausalLMLoss(logits, labels, vocab)

    blocks = [source.meta_block(i) for i in range(source.num_blocks)]
    costs = tuple(block_costs(blocks, config, context))
    family = type(source.skeleton).__name__
    return ModelDef(f"{PREFIX}{config_path}", source.num_blocks, source, loss, batch, costs, tied_groups(source),
                    checkpoint_name=model_name, eval_batch=eval_batch if held_out is not None else None,
                    eval_windows=0 if held_out is None else len(held_out) // context,
                    tp_plan=plan_for(family, config), expert_plan=expert_plan_for(family, config),
                    ep_check=partial(check_ep, family, config),
                    heads=head_counts(config),
                    context=side, sizes_key=None if side is None else packed_documents, tokenizer=tokenizer)


def _document_context(stream: TokenStream, held_out: Optional[TokenStream], tokenizer: Optional[Path], config):
    """The batch context of ``--packing documents``: position ids restarting after every
    end-of-sequence id (ConfigError for data read as bytes, which has no documents)."""
    for part, flag in ((stream, "--data"), (held_out, "--eval-data")):
        if part is not None and part.modulo is not None:
            raise ConfigError(f"--packing documents: {flag} is read as bytes (no tokenizer), which holds no "
                              "documents: give a tokenizer, or token files, or use --packing across")
    eos = eos_ids(None if tokenizer is None else tokenizer_eos(str(tokenizer)), getattr(config, "eos_token_id", None),
                  "--data", config.vocab_size)
    return lambda ids: {"position_ids": document_positions(ids, eos)}


def packed_documents(context: dict) -> bool:
    """Whether transformers finds more than one document in a row of these positions (its own
    ``find_packed_sequence_indices``): it then builds an explicit block-diagonal mask, which
    attention saves, where it otherwise runs SDPA's causal kernel without one."""
    from transformers.masking_utils import find_packed_sequence_indices

    return find_packed_sequence_indices(context["position_ids"]) is not None


@lru_cache(maxsize=2)
def tokenizer_eos(folder: str) -> Optional[int]:
    """The end-of-sequence id of the tokenizer in ``folder`` (None: it has none), read once per process."""
    return load_tokenizer(Path(folder)).eos_token_id
