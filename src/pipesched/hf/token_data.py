"""``--data`` for a Hugging Face model: token ids read in bounded memory, from a regular file only.

A text file's bytes are token ids (modulo the vocabulary), a ``.npy`` holds them as integers.
Either is mapped, not read: memory holds the file's pages once (as the OS caches them) and each
batch copies only its windows, so a 300 MB text costs about 300 MB, not the 18 times that
reading, copying and widening it to int64 took. A device (``/dev/zero``), a FIFO or a folder is
refused before anything is read: they could hang the run or fill its memory.
"""

from __future__ import annotations

import os
import stat
from typing import Optional

import numpy as np
import torch

from ..errors import ConfigError


class TokenStream:
    """Token ids ``0..vocab-1``: the windows a batch asks for, widened to int64 when asked."""

    def __init__(self, ids: np.ndarray, vocab_size: int) -> None:
        self.ids, self.vocab_size = ids, vocab_size

    def __len__(self) -> int:
        return len(self.ids)

    def windows(self, starts: torch.Tensor, length: int) -> torch.Tensor:
        """``len(starts)`` windows of ``length`` tokens, each from its start: (len(starts), length)."""
        index = starts.numpy()[:, None] + np.arange(length)
        return torch.from_numpy(np.asarray(self.ids[index], dtype=np.int64) % self.vocab_size)


def token_stream(data: Optional[str], vocab_size: int) -> TokenStream:
    """The training tokens: ``data``'s bytes or ``.npy`` ids, or the shipped text's bytes."""
    if data is None:
        from ..runtime.datasets import shipped_text

        return TokenStream(np.frombuffer(shipped_text().encode("utf-8"), dtype=np.uint8), vocab_size)
    size = _regular_file_size(data)
    if data.endswith(".npy"):
        return TokenStream(_npy_ids(data, vocab_size), vocab_size)
    if size == 0:  # nothing to map
        return TokenStream(np.zeros(0, dtype=np.uint8), vocab_size)
    try:
        return TokenStream(np.memmap(data, dtype=np.uint8, mode="r"), vocab_size)
    except (OSError, ValueError) as err:
        raise ConfigError(f"--data {data!r}: cannot read it ({getattr(err, 'strerror', None) or err})") from None


def _regular_file_size(data: str) -> int:
    try:
        info = os.stat(data)
    except OSError as err:
        raise ConfigError(f"--data {data!r}: {err.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"--data {data!r} is not a regular file (a device, a FIFO or a folder): give a file of tokens")
    return info.st_size


def _npy_ids(data: str, vocab_size: int) -> np.ndarray:
    try:
        ids = np.load(data, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ConfigError(f"--data {data!r}: cannot read it as a .npy array ({err})") from None
    if not isinstance(ids, np.ndarray) or ids.dtype.kind not in "iu" or ids.ndim != 1:
        shape = f"{ids.ndim}-D {ids.dtype}" if isinstance(ids, np.ndarray) else type(ids).__name__
        raise ConfigError(f"--data {data!r}: expected a 1-D array of integer token ids, got {shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ConfigError(f"--data {data!r}: token ids must be in 0..{vocab_size - 1} (the vocabulary), "
                          f"found {int(ids.min())}..{int(ids.max())}")
    return ids
