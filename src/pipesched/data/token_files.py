"""Token files: a flat array of token ids, memory-mapped (nanoGPT's layout).

- ``.bin``: raw token ids, no header, ``uint16`` (nanoGPT's ``train.bin``) for a vocabulary of
  at most 65,536 ids, ``uint32`` for a larger one (Llama 3's 128,256), in the machine's byte order;
- ``.npy``: a 1-D numpy array of any integer dtype.

Only the windows a step reads are paged in, so a file of any size costs a rank its windows. The
check that every id is inside the vocabulary reads the file in chunks of :data:`CHUNK` ids into one
reused buffer (a read, not the mapping, so the pages it went through are not the process's).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ConfigError

CHUNK = 1 << 22  # ids per read of the vocabulary check: 8 MiB of uint16
TOKEN_SUFFIXES = (".bin", ".npy")


def bin_dtype(vocab_size: int) -> np.dtype:
    """The dtype of a ``.bin`` token file for a vocabulary of ``vocab_size`` ids."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def open_token_file(path: str, vocab_size: int, flag: str = "--data") -> np.ndarray:
    """The ids of a ``.bin`` or ``.npy`` token file, memory-mapped and read-only, every id checked
    to be in ``0..vocab_size-1`` (ConfigError, one line, naming ``flag``, otherwise)."""
    dtype, offset, count = _layout(path, vocab_size, flag)
    if count == 0:
        raise ConfigError(f"{flag} {path!r}: the file holds no token ids")
    _check_range(path, dtype, offset, count, vocab_size, flag)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))


def _layout(path: str, vocab_size: int, flag: str) -> tuple[np.dtype, int, int]:
    """(dtype, bytes before the first id, number of ids) of the file."""
    try:
        size = Path(path).stat().st_size
        if path.endswith(".npy"):
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read(f)
                offset = f.tell()
            if dtype.kind not in "iu" or len(shape) != 1:
                raise ConfigError(f"{flag} {path!r}: expected a 1-D array of integer token ids, got {len(shape)}-D {dtype}")
            return dtype, offset, shape[0]
    except OSError as err:
        raise ConfigError(f"{flag} {path!r}: {err.strerror}") from None
    except ValueError as err:
        raise ConfigError(f"{flag} {path!r}: cannot read it as a .npy array ({err})") from None
    dtype = bin_dtype(vocab_size)
    if size % dtype.itemsize:
        raise ConfigError(f"{flag} {path!r}: {size} bytes is not a whole number of {dtype} token ids "
                          f"(a .bin holds {dtype} ids for a vocabulary of {vocab_size})")
    return dtype, 0, size // dtype.itemsize


def _check_range(path: str, dtype: np.dtype, offset: int, count: int, vocab_size: int, flag: str) -> None:
    low, high = None, None
    buffer = np.empty(min(CHUNK, count), dtype=dtype)
    with open(path, "rb") as f:
        f.seek(offset)
        done = 0
        while done < count:
            n = f.readinto(memoryview(buffer)[: min(CHUNK, count - done)].cast("B")) // dtype.itemsize
            if n == 0:
                raise ConfigError(f"{flag} {path!r}: the file ends after {done} of its {count} token ids")
            part = buffer[:n]
            low = part.min() if low is None else min(low, part.min())
            high = part.max() if high is None else max(high, part.max())
            done += n
    if low < 0 or high >= vocab_size:
        raise ConfigError(f"{flag} {path!r}: token ids must be in 0..{vocab_size - 1} (the vocabulary), "
                          f"found {int(low)}..{int(high)}")
