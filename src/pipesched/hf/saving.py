"""Writing a pipelined model back as Hugging Face reads it, and checkpoints under the model's names.

:func:`save_pretrained` gathers the whole state dict on rank 0 and writes it with the model's
own ``save_pretrained`` (config and safetensors; a tied head is written once, as transformers
writes it), so ``AutoModelForCausalLM.from_pretrained(DIR)`` loads it. :func:`save_checkpoint`
and :func:`load_checkpoint` use :mod:`pipesched.runtime.checkpoints.checkpoint` (DCP) on the rank's part of
the model under the model's names (``model.model.layers.3.mlp.up_proj.weight``), so a
checkpoint resumes under any schedule and rank count. Both check first, on every rank alike and
before any collective, what ``pipesched train --checkpoint-dir`` checks before its launch, in the
same words: a folder that cannot be written, a checkpoint of another model or optimizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

import torch.distributed as dist

from ..runtime.checkpoints.checkpoint import DEFAULT_KEEP
from .build import meta_model

PathLike = Union[str, Path]


def save_pretrained(runtime, directory: PathLike, dst: int = 0) -> None:
    """Write the pipelined model as ``from_pretrained(directory)`` loads it (collective: every
    rank calls it; global rank ``dst`` writes)."""
    state = runtime.gather_state_dict(dst)
    if state is not None:
        write_pretrained(runtime.config, state, directory)
    if dist.is_initialized():
        dist.barrier()


def write_pretrained(config, state: dict, directory: PathLike) -> None:
    """Write the whole model's ``state`` (the model's names) with its config, as transformers does."""
    from transformers.utils import logging

    logging.disable_progress_bar()  # a bar per shard on a run's output
    model = meta_model(config)
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.tie_weights()
    model.save_pretrained(str(directory))


def write_tokenizer(source: Path, directory: PathLike) -> None:
    """Write the tokenizer of folder ``source`` into ``directory`` as ``AutoTokenizer`` saves it."""
    from ..data.tokenize_text import load_tokenizer

    load_tokenizer(source).save_pretrained(str(directory))


def save_checkpoint(runtime, directory: PathLike, keep: int = DEFAULT_KEEP) -> Path:
    """Checkpoint the run after its ``steps_done`` steps under the model's names (collective)."""
    from ..runtime.checkpoints.checkpoint_files import writable_folder
    from .pipeline import model_name

    writable_folder(directory)
    return runtime.runtime.save_checkpoint(directory, keep, model_name)


def load_checkpoint(runtime, path: PathLike) -> int:
    """Load a checkpoint saved under any schedule or rank count; returns the step it was saved
    after. A checkpoint of another model (a larger one included) or optimizer is refused first
    (:func:`pipesched.training.launch_checks.check_checkpoint_of`, as ``train --resume`` refuses it)."""
    from ..runtime.checkpoints.checkpoint import model_shapes
    from ..training.checkpoint_checks import check_checkpoint_of
    from .pipeline import model_name, tied_groups

    source = runtime.source
    check_checkpoint_of(Path(path), model_shapes(source, source.num_blocks, tied_groups(source), model_name),
                        runtime.runtime.optimizer)
    return runtime.runtime.load_checkpoint(path, model_name)

