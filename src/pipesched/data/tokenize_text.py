"""Text through the model folder's own tokenizer, into a cached token file.

The tokenizer is ``tokenizer.json`` in a local folder (``--tokenizer DIR``, by default the folder
of the model's config), loaded with transformers' ``AutoTokenizer`` from that folder alone
(``local_files_only``: nothing is downloaded). Each document's ids are the tokenizer's without
special tokens, followed by the end-of-sequence id (:func:`document_end`: the tokenizer's
eos_token, else the model config's ``eos_token_id``, the rule ``--packing documents`` finds
documents by): the documents of a file become one stream, separated by EOS (whether a window's
documents attend to each other is ``--packing``: :mod:`.packing`). A tokenizer saved by the
``tokenizers`` package alone (``tokenizer.json`` without ``tokenizer_config.json``) names no
eos_token; with no ``eos_token_id`` in the config either, the documents are joined with nothing
between them, and the command says so in one line.

The stream is written once, a batch of bounded pieces of documents at a time (bounded memory:
:mod:`.text_documents`), to a ``.bin`` token
file (:mod:`.token_files`' layout) in the cache folder (``$PIPESCHED_CACHE_DIR``, else
``$XDG_CACHE_HOME/pipesched`` or ``~/.cache/pipesched``), named by the text file (path, size,
modification time) and the tokenizer's files; the launcher writes it before any rank starts and
every rank memory-maps it.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import ConfigError
from .text_documents import documents
from .token_files import bin_dtype

TOKENIZER_FILE = "tokenizer.json"
_KEYED_FILES = (TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json")
_FORMAT = b"pipesched-tokens-3"  # changes when the stream's definition does (2: a long text in pieces; 3: the config's EOS)


def cache_dir() -> Path:
    """Where tokenized streams are kept (see the module's docstring)."""
    if os.environ.get("PIPESCHED_CACHE_DIR"):
        return Path(os.environ["PIPESCHED_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pipesched"


def find_tokenizer(given: Optional[str], model_folder: Path) -> Optional[Path]:
    """The tokenizer folder: ``given`` (ConfigError unless it holds tokenizer.json), else the
    model's folder when it holds one, else None (no tokenizer). A tokenizer file that is there
    but is not a regular file (a FIFO, a device, a folder, a broken link) is refused: loading it
    would wait on the FIFO or read the device for ever, and passing over it would read the text
    as bytes."""
    folder = Path(given) if given is not None else model_folder
    for name in _KEYED_FILES:
        path = folder / name
        if os.path.lexists(path) and not path.is_file():
            raise ConfigError(f"{'--tokenizer' if given is not None else 'the tokenizer'} {str(path)!r} is not a "
                              "regular file (a FIFO, a device, a folder or a broken link): replace it with the "
                              "tokenizer's file")
    if given is not None and not (folder / TOKENIZER_FILE).is_file():
        raise ConfigError(f"--tokenizer {given!r}: no {TOKENIZER_FILE} in that folder")
    return folder if (folder / TOKENIZER_FILE).is_file() else None


def document_end(tokenizer_eos: Optional[int], config_eos) -> tuple[list, str]:
    """The ids that end a document and where they come from: the tokenizer's eos_token where it
    has one, else the config's ``eos_token_id`` (one id or a list; ``[]`` when it has none)."""
    if tokenizer_eos is not None:
        return [tokenizer_eos], "the tokenizer's eos_token"
    if config_eos is None:
        return [], "no end-of-sequence id"
    return (list(config_eos) if isinstance(config_eos, (list, tuple)) else [config_eos]), "the config's eos_token_id"


def tokenized_file(data: str, tokenizer: Path, vocab_size: int, flag: str = "--data", config_eos=None) -> str:
    """The cached token file of ``data``'s text (written first if it is not there yet);
    ``config_eos``: the model config's ``eos_token_id``, the separator where the tokenizer has none."""
    try:
        stat = Path(data).stat()
    except OSError as err:
        raise ConfigError(f"{flag} {data!r}: {err.strerror}") from None
    key = hashlib.sha256(_FORMAT)
    key.update(f"{Path(data).resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0{vocab_size}\0{config_eos!r}".encode())
    for name in _KEYED_FILES:
        if (tokenizer / name).is_file():
            key.update(name.encode() + (tokenizer / name).read_bytes())
    target = cache_dir() / f"tokens-{key.hexdigest()[:24]}.bin"
    if not target.is_file():
        _write_stream(data, tokenizer, vocab_size, target, flag, config_eos)
    return str(target)


def load_tokenizer(folder: Path):
    """transformers' AutoTokenizer of ``folder``, from its files alone; ConfigError (one line)
    when they do not make a tokenizer."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except RecursionError:
        raise ConfigError(f"the tokenizer in {str(folder)!r} cannot be loaded: its JSON is nested too deep") from None
    except Exception as err:  # noqa: BLE001  the tokenizers library raises a bare Exception for a file it cannot parse
        first = (str(err).splitlines() or [type(err).__name__])[0][:300]
        if isinstance(err, KeyError):  # transformers reading a JSON that is not a tokenizer's ("{}")
            first = f"its files lack the key {first}: is {TOKENIZER_FILE} a tokenizer's?"
        raise ConfigError(f"the tokenizer in {str(folder)!r} cannot be loaded: {first}") from None


def _write_stream(data: str, folder: Path, vocab_size: int, target: Path, flag: str, config_eos) -> None:
    """Tokenize ``data`` into ``target``, whole or not at all: through a partial file of this
    process, removed on any failure (and, if this process is killed, by the next run's write)."""
    tokenizer = load_tokenizer(folder)
    eos = _separator(tokenizer.eos_token_id, config_eos, vocab_size, f"{flag} {data!r}", folder)
    dtype = bin_dtype(vocab_size)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    written = 0
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(target.parent)
        with open(partial, "wb") as out:
            for batch in documents(data, flag):
                encoded = tokenizer([text for text, _ in batch], add_special_tokens=False)["input_ids"]
                ids = np.array([i for one, (_, ends) in zip(encoded, batch) for i in one + (eos if ends else [])],
                               dtype=np.int64)
                if ids.size and ids.max() >= vocab_size:
                    raise ConfigError(f"{flag} {data!r}: the tokenizer in {str(folder)!r} gives token id {int(ids.max())}, "
                                      f"beyond the model's vocabulary of {vocab_size}")
                out.write(ids.astype(dtype).tobytes())
                written += ids.size
        if written == 0:
            raise ConfigError(f"{flag} {data!r}: no text to train on")
        os.replace(partial, target)  # whole or not at all: ranks never see a partial stream
    except OSError as err:
        raise ConfigError(f"{flag} {data!r}: cannot write its tokens to {str(target)!r} ({err.strerror}): "
                          "set PIPESCHED_CACHE_DIR to a writable folder with room") from None
    finally:
        try:
            partial.unlink(missing_ok=True)
        except OSError:  # the cache path is not a folder: nothing was written
            pass


def _separator(tokenizer_eos: Optional[int], config_eos, vocab_size: int, where: str, folder: Path) -> list[int]:
    """The id written after each document (:func:`document_end`'s first; a list's first, as
    Llama 3's); none, said in one line, where there is none or the config's is no id of the
    vocabulary (the tokenizer's is checked with the text's ids: one beyond it is refused)."""
    ids, source = document_end(tokenizer_eos, config_eos)
    if tokenizer_eos is not None or (ids and type(ids[0]) is int and 0 <= ids[0] < vocab_size):
        return ids[:1]
    why = (f"the tokenizer in {str(folder)!r} has no eos_token and the config no eos_token_id" if not ids else
           f"{source} {ids[0]!r:.40} is no token id of the vocabulary (0 to {vocab_size - 1})")
    print(f"pipesched: {where}: {why}: its documents are joined with nothing between them (name an eos_token in "
          "the tokenizer's tokenizer_config.json, or eos_token_id in the config)", file=sys.stderr, flush=True)
    return []


def _remove_abandoned(cache: Path) -> None:
    """Remove the partial token files of ``cache`` whose writers no longer run (killed while
    tokenizing: a process that is killed cannot remove its own)."""
    for path in cache.glob(".tokens-*.bin.*.partial"):
        pid = path.name.rsplit(".", 2)[1]
        if pid.isdigit() and not _running(int(pid)):
            path.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: running
        return True
    return True
