"""Which file of a ``--hf-weights`` folder holds each tensor, checked before any is read.

The blocks are float32 (torch's default dtype) and read every weight by copying into them, which
casts whatever is stored: a ``bool`` or ``int64`` tensor would become a weight silently (a model
that trains from nonsense), and a key stored in two files would be taken from whichever came
last. So a tensor of a dtype that is not floating point is refused, a key in two files is
refused naming both, and :func:`narrowed` names the tensors that lose precision (float64).
Only the files' headers are read (safetensors keeps each tensor's dtype and shape there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from ..errors import ConfigError

FLOATS = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}  # safetensors' names of floating-point dtypes
NARROWED = {"F64"}  # more precise than the float32 the blocks hold


def index_weights(files: Iterable[Path], named: str = "--hf-weights") -> tuple[dict[str, Path], dict[str, str]]:
    """For every tensor of ``files``: the file that holds it, and its dtype (safetensors' name);
    errors name the folder as the caller gave it (``named``)."""
    from safetensors import safe_open

    where: dict[str, Path] = {}
    dtypes: dict[str, str] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                keys = {key: f.get_slice(key).get_dtype() for key in f.keys()}
        except Exception as err:  # a truncated or foreign file: say which
            raise ConfigError(f"{named}: cannot read {file}: {' '.join(str(err).split())[:300]}") from None
        for key, dtype in keys.items():
            if key in where:
                raise ConfigError(f"{named}: {key!r} is stored twice, in {where[key]} and in {file}: "
                                  "keep one of them")
            if dtype not in FLOATS:
                raise ConfigError(f"{named}: {key!r} in {file} is {dtype}, not a floating-point tensor: "
                                  "a weight cannot be read from it")
            where[key], dtypes[key] = file, dtype
    return where, dtypes


def weight_files(folder: Path) -> list[Path]:
    """The ``*.safetensors`` files of ``folder`` (regular files only), sorted."""
    return sorted(p for p in folder.glob("*.safetensors") if p.is_file()) if folder.is_dir() else []


def narrowed(folder: Path, named: str = "--hf-weights") -> str:
    """A line naming what reading ``folder`` rounds (float64 tensors read as float32), or ""
    (errors and the line name the folder as ``named``)."""
    _, dtypes = index_weights(weight_files(folder), named)
    names = sorted(k for k, d in dtypes.items() if d in NARROWED)
    if not names:
        return ""
    which = f"{names[0]!r} and {len(names) - 1} more are" if len(names) > 1 else f"{names[0]!r} is"
    return (f"{named}: {which} float64, read into float32 weights "
            "(rounded to float32's precision)")
