"""Mixed precision: fp32 weights and optimizer state, compute and stage-boundary tensors in bf16.

With ``dtype=torch.bfloat16`` the stages' forwards (and the loss) run under
``torch.autocast(device, bfloat16)``: matmuls in bf16, reductions and norms where autocast keeps
them in fp32. Parameters stay fp32, so their gradients accumulate in fp32 and the optimizer steps
fp32 weights. The activations and input gradients crossing a stage boundary travel in bf16: half
the bytes of fp32 on every link. ``dtype=torch.float32`` changes nothing.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import ContextManager

import torch

from ...errors import ConfigError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def parse_dtype(name: str) -> torch.dtype:
    """``fp32`` or ``bf16`` as a torch dtype."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ConfigError(f"--dtype {name!r} is not known: use one of {', '.join(DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, d in DTYPES.items() if d == dtype)


@dataclass(frozen=True)
class Precision:
    """The compute dtype of a runtime and what follows from it."""

    dtype: torch.dtype = torch.float32
    device_type: str = "cpu"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES.values():
            raise ConfigError(f"dtype must be torch.float32 or torch.bfloat16, got {self.dtype}")

    @property
    def mixed(self) -> bool:
        return self.dtype != torch.float32

    def autocast(self) -> ContextManager:
        """The context the forwards and the loss run in."""
        if not self.mixed:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a boundary tensor of ``dtype`` travels in (integer tensors as they are)."""
        return self.dtype if self.mixed and dtype.is_floating_point else dtype

    def to_wire(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.wire_dtype(tensor.dtype))
