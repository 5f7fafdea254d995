"""The optimizers ``pipesched train`` offers, by name.

Importing this module does not import torch (it is imported when an optimizer is made), so the
command line can refuse an unknown name before paying for torch.
"""

from __future__ import annotations

from typing import Callable, Optional

from .lr_schedule import decay_groups, default_weight_decay

OPTIMIZERS = ("sgd", "adamw")


def make_optimizer(name: str, lr: float, weight_decay: Optional[float] = None) -> Callable:
    """The optimizer factory for ``name``: SGD, or AdamW with torch's defaults otherwise; weight
    decay (default: the optimizer's, AdamW 0.01, SGD 0) on matrices only (:func:`~.lr_schedule.decay_groups`).

    Both act on each parameter alone, so a pipeline steps exactly as the unpipelined model does."""
    import torch

    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}: use one of {', '.join(OPTIMIZERS)}")
    optimizer = torch.optim.SGD if name == "sgd" else torch.optim.AdamW
    decay = default_weight_decay(name, weight_decay)
    return lambda params: optimizer([g for g in decay_groups(params, decay) if g["params"]], lr=lr)
