"""Deterministic training batches: every rank can draw the same batch for a step without talking.

Batches depend only on (seed, step), so the first stage's rank reads the inputs, the last stage's
rank the targets, and the single-process reference sees exactly the same data.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import torch


@lru_cache(maxsize=1)
def shipped_text() -> str:
    """The small public-domain text shipped with pipesched (written for it)."""
    return resources.files("pipesched").joinpath("data/tiny_text.txt").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def text_vocabulary() -> str:
    return "".join(sorted(set(shipped_text())))


@lru_cache(maxsize=1)
def _encoded_text() -> torch.Tensor:
    index = {c: i for i, c in enumerate(text_vocabulary())}
    return torch.tensor([index[c] for c in shipped_text()], dtype=torch.long)


def _generator(step: int, seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(1_000_003 * seed + step)


def text_batch(step: int, size: int, seed: int, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` random windows of the text: inputs (size, context) and next-character targets."""
    data = _encoded_text()
    starts = torch.randint(0, len(data) - context - 1, (size,), generator=_generator(step, seed))
    offsets = starts[:, None] + torch.arange(context + 1)
    windows = data[offsets]
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def random_regression_batch(step: int, size: int, seed: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian inputs and targets of shape (size, dim)."""
    gen = _generator(step, seed)
    return torch.randn(size, dim, generator=gen), torch.randn(size, dim, generator=gen)
