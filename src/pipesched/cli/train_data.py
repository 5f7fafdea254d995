"""``pipesched train``'s data options besides ``--data``: ``--seq-len``, ``--tokenizer``,
``--eval-data``, ``--eval-share``, ``--packing`` (with ``--model hf:CONFIG.json``), declared as one group
(:func:`data_options` gives the command a ``data_flags: DataFlags``) and turned into the model's
options here; the model (:mod:`pipesched.hf.cli_model`) refuses what its files make wrong."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from ..errors import ConfigError
from .option_group import option_group


@dataclass(frozen=True)
class DataFlags:
    """The data options as typed."""

    seq_len: Optional[int] = None
    tokenizer: Optional[Path] = None
    eval_data: Optional[Path] = None
    eval_share: Optional[float] = None
    packing: Optional[str] = None

    def check(self) -> None:
        """The values on their own (no torch needed: refused before it is imported)."""
        if self.seq_len is not None and self.seq_len < 2:
            raise ConfigError(f"--seq-len must be at least 2 (tokens per sample), got {self.seq_len}")
        if self.eval_data is not None and self.eval_share is not None:
            raise ConfigError("--eval-data and --eval-share both name the held-out data: give one")
        if self.eval_share is not None and not (math.isfinite(self.eval_share) and 0 < self.eval_share < 1):
            raise ConfigError(f"--eval-share must be above 0 and below 1 (the share of --data held out), got {self.eval_share:g}")
        if self.packing is not None:
            from ..data.packing import check_packing

            check_packing(self.packing)
        if self.tokenizer is not None:  # a folder without tokenizer.json
            from ..data.tokenize_text import find_tokenizer

            find_tokenizer(str(self.tokenizer), Path("."))

    def model_options(self, model: str) -> dict:
        """What ``get_model`` takes of them (only an ``hf:`` model takes any: ConfigError otherwise)."""
        from ..runtime.training.models import HF_PREFIX

        given = {name: value for name, value in (("context", self.seq_len), ("tokenizer", self.tokenizer),
                                                  ("eval_data", self.eval_data), ("eval_share", self.eval_share),
                                                  ("packing", self.packing))
                 if value is not None}
        if given and not model.startswith(HF_PREFIX):
            flags = {"context": "--seq-len", "tokenizer": "--tokenizer", "eval_data": "--eval-data", "eval_share": "--eval-share",
                     "packing": "--packing"}
            raise ConfigError(f"{' and '.join(flags[k] for k in given)} only {'apply' if len(given) > 1 else 'applies'} "
                              "to --model hf:CONFIG.json")
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in given.items()}

    @property
    def held_out(self) -> bool:
        return self.eval_data is not None or self.eval_share is not None


DATA_OPTIONS = (
    ("seq_len", Optional[int], typer.Option(
        None, "--seq-len", help="With --model hf:...: tokens per sample (default 64, or the model's positions if fewer).")),
    ("tokenizer", Optional[Path], typer.Option(
        None, "--tokenizer", help="With --model hf:...: the folder of the tokenizer.json that tokenizes text --data "
        "(default: the config's folder; without one, text is read as bytes).")),
    ("eval_data", Optional[Path], typer.Option(
        None, "--eval-data", help="With --model hf:...: held-out data (any --data format) evaluated every --eval-every steps.")),
    ("eval_share", Optional[float], typer.Option(
        None, "--eval-share", help="With --model hf:...: hold out this share of --data's end for evaluation instead.")),
    ("packing", Optional[str], typer.Option(
        None, "--packing", help="With --model hf:...: across (default: a window's documents attend to each other) or "
        "documents (positions restart and attention stops at every end-of-sequence token).")),
)


def data_options(command):
    """Give ``pipesched train`` the data options in place of its ``data_flags: DataFlags`` parameter."""
    return option_group("data_flags", DataFlags, DATA_OPTIONS)(command)


def say_how_text_is_read(model: str, data: Optional[Path], tokenizer: Optional[Path]) -> None:
    """Say on stderr when ``--data`` is read as bytes (an ``hf:`` model's folder without a tokenizer;
    the shipped text, the default, is read so silently)."""
    from ..data.token_files import TOKEN_SUFFIXES
    from ..data.tokenize_text import find_tokenizer
    from ..hf.config_file import model_folder

    folder = model_folder(model.split(":", 1)[1])
    if data is not None and not str(data).endswith(TOKEN_SUFFIXES) and find_tokenizer(
            None if tokenizer is None else str(tokenizer), folder) is None:
        typer.echo(f"pipesched: no tokenizer.json in {str(folder)!r}: reading --data as bytes "
                   "(token id = byte modulo the vocabulary)", err=True)
