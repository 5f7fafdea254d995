"""``pipesched train``'s data options besides ``--data``: ``--seq-len``, ``--tokenizer``,
``--eval-data``, ``--eval-share``, ``--packing`` (with ``--model hf:CONFIG.json``; declared in
:mod:`pipesched.training.config.run_config`), checked together and turned into the model's options here; the model
(:mod:`pipesched.hf.cli_model`) refuses what its files make wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ...errors import ConfigError
from ..config.run_config import DataSection, EvaluationSection
from .say import say


def check_data(data: DataSection, evaluation: EvaluationSection) -> None:
    """The data options together (no torch needed: refused before it is imported); each one's
    own range is on its declaration."""
    if evaluation.eval_data is not None and evaluation.eval_share is not None:
        raise ConfigError("--eval-data and --eval-share both name the held-out data: give one")
    if data.packing is not None:
        from ...data.packing import check_packing

        check_packing(data.packing)
    if data.tokenizer is not None:  # a folder without tokenizer.json
        from ...data.tokenize_text import find_tokenizer

        find_tokenizer(str(data.tokenizer), Path("."))


def data_model_options(model: str, data: DataSection, evaluation: EvaluationSection) -> dict:
    """What ``get_model`` takes of them (only an ``hf:`` model takes any: ConfigError otherwise)."""
    from ..models import HF_PREFIX

    given = {name: value for name, value in (("context", data.seq_len), ("tokenizer", data.tokenizer),
                                              ("eval_data", evaluation.eval_data), ("eval_share", evaluation.eval_share),
                                              ("packing", data.packing))
             if value is not None}
    if given and not model.startswith(HF_PREFIX):
        flags = {"context": "--seq-len", "tokenizer": "--tokenizer", "eval_data": "--eval-data", "eval_share": "--eval-share",
                 "packing": "--packing"}
        raise ConfigError(f"{' and '.join(flags[k] for k in given)} only {'apply' if len(given) > 1 else 'applies'} "
                          "to --model hf:CONFIG.json")
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in given.items()}


def say_how_text_is_read(model: str, data: Optional[Path], tokenizer: Optional[Path]) -> None:
    """Say on stderr when ``--data`` is read as bytes (an ``hf:`` model's folder without a tokenizer;
    the shipped text, the default, is read so silently)."""
    from ...data.token_files import TOKEN_SUFFIXES
    from ...data.tokenize_text import find_tokenizer
    from ...hf.config_file import model_folder

    folder = model_folder(model.split(":", 1)[1])
    if data is not None and not str(data).endswith(TOKEN_SUFFIXES) and find_tokenizer(
            None if tokenizer is None else str(tokenizer), folder) is None:
        say(f"pipesched: no tokenizer.json in {str(folder)!r}: reading --data as bytes "
            "(token id = byte modulo the vocabulary)")
