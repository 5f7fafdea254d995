"""Which configurations the advisor tries: families x chunk counts x microbatch counts.

Families come from the registry, so a family registered later (by a plug-in or another module)
is searched without changes here. Chunk counts run over what each family accepts, capped at
``max_chunks`` (more chunks shrink the bubble less and less while multiplying messages).
Microbatch counts are fixed by ``--microbatches``, or, with a global batch, every divisor of it
that leaves microbatches of at least ``min_microbatch_size`` samples, up to a cap, thinned to a
geometric ladder so the search stays fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from ..errors import ConfigError
from ..registry import Family

MAX_MICROBATCH_OPTIONS = 10


@dataclass(frozen=True)
class BatchPlan:
    """The microbatch counts to try and the reference the costs were given for."""

    options: tuple[int, ...]  # microbatch counts, ascending
    reference: int  # the user's microbatch count (costs are for its microbatch size)
    global_batch: Optional[int] = None  # samples per iteration, when known
    microbatch_size: Optional[int] = None  # samples per reference microbatch, when known

    def scale(self, microbatches: int) -> float:
        """Size of one of ``microbatches`` microbatches relative to the reference microbatch."""
        return self.reference / microbatches

    def size(self, microbatches: int) -> Optional[int]:
        """Samples per microbatch when the global batch is known."""
        return None if self.global_batch is None else self.global_batch // microbatches


def batch_plan(
    ranks: int,
    microbatches: Optional[int] = None,
    global_batch: Optional[int] = None,
    microbatch_size: Optional[int] = None,
    min_microbatch_size: int = 1,
    max_microbatches: Optional[int] = None,
) -> BatchPlan:
    """The microbatch counts to search (see the module docstring); bad combinations raise."""
    if global_batch is None:
        if microbatches is None:
            raise ConfigError(
                "give --microbatches M, or --global-batch G with --microbatch-size b to let the advisor choose M"
            )
        _positive("microbatches", microbatches)
        return BatchPlan((microbatches,), microbatches, None, microbatch_size)
    _positive("global batch", global_batch)
    if microbatches is not None:
        _positive("microbatches", microbatches)
        if global_batch % microbatches:
            raise ConfigError(
                f"global batch {global_batch} does not split into {microbatches} equal microbatches; "
                f"use a divisor of {global_batch}"
            )
        return BatchPlan((microbatches,), microbatches, global_batch, global_batch // microbatches)
    if microbatch_size is None:
        raise ConfigError("--global-batch needs --microbatch-size b (the size your costs were measured at)")
    _positive("microbatch size", microbatch_size)
    if global_batch % microbatch_size:
        raise ConfigError(
            f"global batch {global_batch} is not divisible by microbatch size {microbatch_size}; "
            f"use a microbatch size that divides it ({_divisor_hint(global_batch)})"
        )
    _positive("minimum microbatch size", min_microbatch_size)
    reference = global_batch // microbatch_size
    cap = max_microbatches if max_microbatches is not None else max(reference, 8 * ranks)
    _positive("max microbatches", cap)
    options = [
        m for m in divisors(global_batch)
        if m <= cap and global_batch // m >= min_microbatch_size
    ]
    options = thin(options, keep=reference, limit=MAX_MICROBATCH_OPTIONS)
    return BatchPlan(tuple(options), reference, global_batch, microbatch_size)


def divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def thin(values: Sequence[int], keep: int, limit: int) -> list[int]:
    """At most ``limit`` of ``values`` (ascending), spread geometrically, always with ``keep``."""
    values = sorted(set(values) | {keep})
    if len(values) <= limit:
        return values
    lo, hi = values[0], values[-1]
    ladder = {lo, hi}
    for i in range(1, limit - 1):
        target = lo * (hi / lo) ** (i / (limit - 1))
        ladder.add(min(values, key=lambda v: abs(math.log(v / target))))
    if keep not in ladder:
        if len(ladder) >= limit:
            inner = ladder - {lo, hi}
            ladder.discard(min(inner, key=lambda v: abs(math.log(v / keep))))
        ladder.add(keep)
    return sorted(ladder)


def microbatch_options(replica_batch: int, microbatch_size: int, options: dict) -> dict:
    """The microbatch counts of a replica's search in either layout search, as
    :func:`~.search.advise` takes them: the count the model's microbatch size gives, and no
    other, unless the caller opened the count with ``max_microbatches`` (every divisor of the
    replica's batch up to it, as ``advise`` searches them). A microbatch size is never changed
    silently."""
    options = dict(options)
    if options.get("max_microbatches") is None:
        options.pop("max_microbatches", None)
        options.pop("min_microbatch_size", None)
        return {**options, "microbatches": replica_batch // microbatch_size, "global_batch": replica_batch}
    return {**options, "global_batch": replica_batch, "microbatch_size": microbatch_size}


def chunk_options(family: Family, max_chunks: int) -> range:
    """Chunk counts of ``family`` to try: its accepted range, capped at ``max_chunks``."""
    top = family.max_chunks if family.max_chunks is not None else max_chunks
    top = min(top, max(max_chunks, family.min_chunks))
    return range(family.min_chunks, top + 1)


@dataclass(frozen=True)
class Setting:
    """One configuration to build and simulate."""

    family: Family
    chunks: int
    microbatches: int


def settings(families: Iterable[Family], plan: BatchPlan, max_chunks: int) -> list[Setting]:
    """Every (family, chunks, microbatches) combination to try."""
    return [
        Setting(f, v, m)
        for m in plan.options
        for f in families
        for v in chunk_options(f, max_chunks)
    ]


def _positive(label: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{label} must be a whole number of at least 1, got {value!r}")


def _divisor_hint(n: int) -> str:
    ds = divisors(n)
    shown = ", ".join(str(d) for d in ds[:8])
    return f"e.g. {shown}" + (", ..." if len(ds) > 8 else "")
