"""The token stream a run trains on, and the windows each step reads from it.

``--data`` chooses the source (:func:`open_stream`): a token file (``.bin``, ``.npy``), text
(``.txt``, ``.jsonl``, ``.parquet``) through the model folder's tokenizer, or, for a folder
without a tokenizer, a file's bytes as token ids modulo the vocabulary (the fallback, for
``.txt`` and any other file; the command says so). Every source is memory-mapped: a rank holds
the windows of its step, never the file.

A training batch is :func:`train_windows`: ``size`` windows at offsets drawn from a generator
seeded by (seed, step) alone (nanoGPT's ``get_batch``), so every schedule, rank count and
replica count reads the same batches, and a run resumed after step ``k`` reads step ``k+1``'s.
A held-out batch is :func:`eval_windows`: consecutive windows from the held-out stream's start,
the same at every evaluation.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..errors import ConfigError
from .token_files import TOKEN_SUFFIXES, open_token_file
from .tokenize_text import tokenized_file


@dataclass(frozen=True)
class TokenStream:
    """A 1-D array of ids (memory-mapped), taken ``% modulo`` when they are bytes (the fallback)."""

    ids: np.ndarray
    modulo: Optional[int] = None

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, starts: np.ndarray, length: int) -> torch.Tensor:
        """The windows of ``length`` ids at ``starts``, as int64 (one row each)."""
        window = np.asarray(self.ids[starts[:, None] + np.arange(length)], dtype=np.int64)
        return torch.from_numpy(window % self.modulo if self.modulo else window)

    def split(self, share: float) -> tuple["TokenStream", "TokenStream"]:
        """(the first ``1 - share`` of the stream, the last ``share``: the held-out part)."""
        cut = len(self) - int(len(self) * share)
        return TokenStream(self.ids[:cut], self.modulo), TokenStream(self.ids[cut:], self.modulo)


def shipped_text_path() -> str:
    """The text shipped with pipesched, as a file."""
    return str(resources.files("pipesched").joinpath("data/tiny_text.txt"))


def open_stream(data: Optional[str], vocab_size: int, tokenizer: Optional[Path], flag: str = "--data",
                config_eos=None) -> TokenStream:
    """The stream of ``data`` (None: the shipped text) for a vocabulary of ``vocab_size``
    (``config_eos``: the config's ``eos_token_id``, text's separator where the tokenizer has none). Only a
    regular file with something in it is read (a device such as ``/dev/zero`` or a FIFO could hang
    the run or fill its memory), and only mapped: memory holds its pages once, as the OS caches them."""
    path = data if data is not None else shipped_text_path()
    _check_regular(path, flag)
    if path.endswith(TOKEN_SUFFIXES):
        return TokenStream(open_token_file(path, vocab_size, flag))
    if tokenizer is not None:
        return TokenStream(open_token_file(tokenized_file(path, tokenizer, vocab_size, flag, config_eos), vocab_size, flag))
    if path.endswith((".jsonl", ".parquet")):
        raise ConfigError(f"{flag} {path!r}: text files need the model's tokenizer: put tokenizer.json next to the "
                          "config or give --tokenizer DIR")
    try:
        return TokenStream(np.memmap(path, dtype=np.uint8, mode="r"), modulo=vocab_size)
    except (OSError, ValueError) as err:  # ValueError: an empty file cannot be mapped
        raise ConfigError(f"{flag} {path!r}: {getattr(err, 'strerror', None) or 'the file is empty'}") from None


def _check_regular(path: str, flag: str) -> None:
    try:
        info = os.stat(path)
    except OSError as err:
        raise ConfigError(f"{flag} {path!r}: {err.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{flag} {path!r} is not a regular file (a device, a FIFO or a folder): give a file of tokens")
    if info.st_size == 0:
        raise ConfigError(f"{flag} {path!r}: 0 tokens, too few for any sample")


def train_windows(stream: TokenStream, step: int, size: int, seed: int, length: int) -> torch.Tensor:
    """Step ``step``'s ``size`` windows (see the module's docstring)."""
    g = torch.Generator().manual_seed(1_000_003 * seed + step)
    starts = torch.randint(0, len(stream) - length, (size,), generator=g)
    return stream.take(starts.numpy(), length)


def eval_windows(stream: TokenStream, index: int, size: int, length: int) -> torch.Tensor:
    """Held-out batch ``index``: windows ``index*size`` to ``index*size + size - 1`` of the
    stream cut into windows of ``length`` (wrapping around a short stream)."""
    count = len(stream) // length
    numbers = (index * size + np.arange(size)) % count
    return stream.take(numbers * length, length)
