"""The optimizers ``pipesched train`` offers, by name.

Importing this module does not import torch (it is imported when an optimizer is made), so the
command line can refuse an unknown name before paying for torch.
"""

from __future__ import annotations

from typing import Callable

OPTIMIZERS = ("sgd", "adamw")


def make_optimizer(name: str, lr: float) -> Callable:
    """The optimizer factory for ``name``: SGD, or AdamW with torch's defaults otherwise.

    Both act on each parameter alone, so a pipeline steps exactly as the unpipelined model does."""
    import torch

    if name == "sgd":
        return lambda params: torch.optim.SGD(params, lr=lr)
    if name == "adamw":
        return lambda params: torch.optim.AdamW(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}: use one of {', '.join(OPTIMIZERS)}")
