"""The documents of a text file, in pieces of bounded size (bounded memory, whatever the file's
size or the length of one document).

- ``.txt``: one document, read :data:`PIECE` characters at a time;
- ``.jsonl``: one JSON object a line, its ``"text"`` field a document (blank lines skipped);
- ``.parquet``: its ``text`` column, a document a row (read a row group's batch at a time; needs
  pyarrow: ``pip install 'pipesched[data]'``).

A tokenizer holds about 230 bytes per character of what it is given at once (its offsets,
pre-tokens and ids), so no text reaches it whole when it is long: a document longer than
:data:`PIECE` characters is cut into pieces of at most that many (:func:`pieces`), each cut
after the last line end in the piece, else before the last whitespace that follows a word (a
boundary of every common pre-tokenizer: GPT-2's byte-level, whitespace, SentencePiece's
metaspace), else, in a piece without whitespace, at :data:`PIECE`. The pieces of a file go to the
tokenizer in batches of at most :data:`ROWS` texts and about :data:`PIECE` characters.

Each mistake (a missing file, a line that is not JSON, nested beyond the parser's depth, without
a ``text``, or holding a lone surrogate, a table without the column) is a one-line ConfigError
naming the flag, the file and the line.
"""

from __future__ import annotations

import json
import re
from typing import Iterable, Iterator

from ..errors import ConfigError

TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
PIECE = 1 << 18  # characters handed to the tokenizer at once: ~60 MB of its working memory
ROWS = 1024  # texts handed to the tokenizer at once (parquet rows read at once)
_WORD_END = re.compile(r"\S(?=\s)")

Piece = tuple[str, bool]  # a text and whether it ends its document


def documents(path: str, flag: str = "--data") -> Iterator[list[Piece]]:
    """The file's texts in batches (see the module's docstring), each text with whether it ends
    its document (the tokenizer's end-of-sequence id follows it then)."""
    try:
        if path.endswith(".jsonl"):
            texts = ((text, True) for text in _jsonl(path, flag))
        elif path.endswith(".parquet"):
            texts = ((text, True) for text in _parquet(path, flag))
        else:
            texts = _txt(path)
        yield from _batches(part for text, ends in texts for part in _ended(pieces(text), ends))
    except OSError as err:
        raise ConfigError(f"{flag} {path!r}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{flag} {path!r}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def pieces(text: str, size: int = PIECE) -> list[str]:
    """``text`` cut into pieces of at most ``size`` characters (where: the module's docstring)."""
    found = []
    while len(text) > size:
        cut = _cut(text, size)
        found.append(text[:cut])
        text = text[cut:]
    return [*found, text]


def _cut(text: str, size: int) -> int:
    """Where to end the first piece of ``text`` (longer than ``size``): 1 to ``size``."""
    line = text.rfind("\n", 0, size)
    if line >= 0:
        return line + 1
    ends = [m.end() for m in _WORD_END.finditer(text, max(0, size - 4096), size + 1) if m.end() <= size]
    return ends[-1] if ends else size


def _ended(parts: list[str], ends: bool) -> Iterator[Piece]:
    """The pieces of one text, the last one ending the document when the text does."""
    for i, part in enumerate(parts):
        yield part, ends and i == len(parts) - 1


def _batches(parts: Iterable[Piece]) -> Iterator[list[Piece]]:
    batch: list[Piece] = []
    size = 0
    for part in parts:
        if batch and (len(batch) == ROWS or size + len(part[0]) > PIECE):
            yield batch
            batch, size = [], 0
        batch.append(part)
        size += len(part[0])
    if batch:
        yield batch


def _txt(path: str) -> Iterator[Piece]:
    """The file as one document, read :data:`PIECE` characters at a time (never a whole line)."""
    with open(path, encoding="utf-8") as f:
        held = ""
        while more := f.read(PIECE):
            held += more
            while len(held) > PIECE:
                cut = _cut(held, PIECE)
                yield held[:cut], False
                held = held[cut:]
        yield held, True


def _jsonl(path: str, flag: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{flag} {path!r}: line {number} is not JSON ({err.msg})") from None
            except RecursionError:
                raise ConfigError(f"{flag} {path!r}: line {number} is JSON nested too deep to read") from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ConfigError(f"{flag} {path!r}: line {number} has no \"text\" field (a string): "
                                  "each line must be an object such as {\"text\": \"...\"}")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as err:
                raise ConfigError(f"{flag} {path!r}: line {number}'s text holds {text[err.start]!r}, a lone surrogate "
                                  "(half of a \\u escape pair), which is not text") from None
            yield text


def _parquet(path: str, flag: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"{flag} {path!r}: reading .parquet needs pyarrow: pip install 'pipesched[data]'") from None
    try:
        table = pq.ParquetFile(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise ConfigError(f"{flag} {path!r}: cannot read it as parquet ({err})") from None
    if "text" not in table.schema_arrow.names:
        raise ConfigError(f"{flag} {path!r}: no \"text\" column (it has {', '.join(table.schema_arrow.names)})")
    for batch in table.iter_batches(batch_size=ROWS, columns=["text"]):
        texts = batch.column(0).to_pylist()
        if any(not isinstance(t, str) for t in texts):
            raise ConfigError(f"{flag} {path!r}: the \"text\" column holds a value that is not a string")
        yield from texts
