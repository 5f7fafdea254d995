"""``--activation-bytes KEEP[,STASH[,INPUT]]`` of ``pipesched simulate``: the sizes, and the
recompute share they imply.

Apart from the command so that :mod:`.plan` holds the planning commands themselves, and this
one compound flag's parsing, bounds and checks sit together.
"""

from __future__ import annotations

from typing import Optional

from ..errors import ConfigError
from ..memory import MemorySizes, StageMemory, parse_size

MAX_ACTIVATION_BYTES = 2.0**50  # 1 PiB per microbatch and rank: far above any device, far below overflow


def activation_share(text: Optional[str]) -> Optional[tuple[float, float, float]]:
    """``--activation-bytes KEEP[,STASH[,INPUT]]`` as bytes (STASH defaults to KEEP, INPUT to 0)."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if not 1 <= len(parts) <= 3:
        raise ConfigError(f"--activation-bytes {text!r}: give KEEP[,STASH[,INPUT]] sizes such as 512MiB,480MiB,16MiB")
    values = []
    for part in parts:
        try:
            size = parse_size(part)
        except ValueError as err:
            raise ConfigError(f"--activation-bytes {err}") from None
        size = float(part) if size is None else size  # a plain number: bytes
        if not 0 <= size <= MAX_ACTIVATION_BYTES:
            raise ConfigError(f"--activation-bytes {part!r} must be from 0 to 1024TiB (one microbatch on one rank)")
        values.append(size)
    keep = values[0]
    if not keep > 0:
        raise ConfigError("--activation-bytes: what F keeps must be above 0")
    stash = values[1] if len(values) > 1 else keep
    if stash > keep:
        raise ConfigError(f"--activation-bytes: the W stash ({parts[1]}) cannot exceed what F keeps ({parts[0]})")
    return keep, stash, values[2] if len(values) > 2 else 0.0


def measured_share(share: tuple[float, float, float], stages_per_rank: int) -> Optional[float]:
    """What a recomputed stage keeps of its activations, for ``--activation-bytes KEEP,STASH,INPUT``
    shared by ``stages_per_rank`` stages (the most a schedule may have: the least each saves);
    None when the input is not given or recomputing would save nothing."""
    keep, stash, inp = share
    if not inp > 0:
        return None
    derived = MemorySizes((StageMemory(keep / stages_per_rank, stash / stages_per_rank),), (inp,)).recompute_share()
    return derived if derived < 1 else None
