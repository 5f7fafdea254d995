"""The documents of a text file, one at a time (bounded memory, whatever the file's size).

- ``.txt``: one document, yielded in pieces of whole lines of about :data:`PIECE` characters;
- ``.jsonl``: one JSON object a line, its ``"text"`` field a document (blank lines skipped);
- ``.parquet``: its ``text`` column, a document a row (read a row group's batch at a time; needs
  pyarrow: ``pip install 'pipesched[data]'``).

Each mistake (a missing file, a line that is not JSON or has no ``text``, a table without the
column) is a one-line ConfigError naming the flag, the file and the line.
"""

from __future__ import annotations

import json
from typing import Iterator

from ..errors import ConfigError

TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
PIECE = 1 << 20  # characters of a .txt handed to the tokenizer at once (whole lines)
ROWS = 1024  # parquet rows read at once


def documents(path: str, flag: str = "--data") -> Iterator[tuple[list[str], bool]]:
    """The file's texts, a few at a time, each batch with whether its texts end documents: a
    ``.jsonl``'s and a ``.parquet``'s do; a ``.txt``'s pieces are one document, ended by its last."""
    try:
        if path.endswith(".jsonl"):
            yield from ((texts, True) for texts in _jsonl(path, flag))
        elif path.endswith(".parquet"):
            yield from ((texts, True) for texts in _parquet(path, flag))
        else:
            pieces = _txt(path)
            held = next(pieces, None)
            for piece in pieces:
                yield [held], False
                held = piece
            if held is not None:
                yield [held], True
    except OSError as err:
        raise ConfigError(f"{flag} {path!r}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{flag} {path!r}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def _txt(path: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        piece: list[str] = []
        size = 0
        for line in f:
            piece.append(line)
            size += len(line)
            if size >= PIECE:
                yield "".join(piece)
                piece, size = [], 0
        if piece:
            yield "".join(piece)


def _jsonl(path: str, flag: str) -> Iterator[list[str]]:
    batch: list[str] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{flag} {path!r}: line {number} is not JSON ({err.msg})") from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ConfigError(f"{flag} {path!r}: line {number} has no \"text\" field (a string): "
                                  "each line must be an object such as {\"text\": \"...\"}")
            batch.append(text)
            if len(batch) == ROWS:
                yield batch
                batch = []
    if batch:
        yield batch


def _parquet(path: str, flag: str) -> Iterator[list[str]]:
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
        yield texts
