"""What crosses a stage edge: a tensor, or a tuple or dict of tensors, each entry with its shape,
dtype and whether it carries a gradient back.

A block may return one tensor (the common case) or a tuple or dict of them (say, a hidden state
and the token ids the next stage needs). The stage edge is described once by a :class:`Boundary`,
and everything that moves or holds what crosses it (the transport, wire precision,
recomputation, the memory meter, output deallocation) works on its flat list of entries.
Floating-point entries are differentiable: the receiving stage makes them require grad and sends
their gradients back (zeros where autograd gives none). Integer and bool entries cross and never
get a gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import torch

Value = Union[torch.Tensor, tuple, dict]


@dataclass(frozen=True)
class Entry:
    """One tensor of a boundary."""

    shape: torch.Size
    dtype: torch.dtype

    @property
    def grad(self) -> bool:
        """Whether this entry carries a gradient back (floating point entries do)."""
        return self.dtype.is_floating_point or self.dtype.is_complex

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class Boundary:
    """The structure of a stage edge's value: ``keys`` None for one tensor, the positions of a
    tuple, or the keys of a dict (in order); one :class:`Entry` per tensor."""

    entries: tuple[Entry, ...]
    keys: Optional[tuple] = None
    is_dict: bool = False

    @staticmethod
    def of(value: Value) -> "Boundary":
        """The boundary ``value`` (a tensor, or a tuple or dict of tensors) crosses."""
        if isinstance(value, torch.Tensor):
            return Boundary((Entry(value.shape, value.dtype),))
        if isinstance(value, dict):
            keys, tensors = tuple(value), list(value.values())
        elif isinstance(value, (tuple, list)):
            keys, tensors = tuple(range(len(value))), list(value)
        else:
            raise TypeError(f"a stage boundary is a tensor or a tuple or dict of tensors, got {type(value).__name__}")
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            raise TypeError("a stage boundary's tuple or dict must hold tensors only")
        return Boundary(tuple(Entry(t.shape, t.dtype) for t in tensors), keys, isinstance(value, dict))

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    @property
    def differentiable(self) -> tuple[int, ...]:
        """The positions of the entries that carry a gradient back."""
        return tuple(i for i, e in enumerate(self.entries) if e.grad)

    def gradients(self) -> "Boundary":
        """The boundary of the gradients sent back across this edge (its differentiable entries)."""
        return Boundary(tuple(self.entries[i] for i in self.differentiable))

    def on_wire(self, wire_dtype) -> "Boundary":
        """This boundary with every entry in the dtype it travels in (``wire_dtype(dtype)``)."""
        return Boundary(tuple(Entry(e.shape, wire_dtype(e.dtype)) for e in self.entries), self.keys, self.is_dict)

    def flatten(self, value: Value) -> list[torch.Tensor]:
        if self.keys is None:
            return [value]
        return list(value.values()) if self.is_dict else list(value)

    def unflatten(self, tensors: Sequence[torch.Tensor]) -> Value:
        if self.keys is None:
            return tensors[0]
        return dict(zip(self.keys, tensors)) if self.is_dict else tuple(tensors)


def flat(value: Any) -> list[torch.Tensor]:
    """The tensors of a boundary value, whatever its structure."""
    if isinstance(value, torch.Tensor):
        return [value]
    return list(value.values()) if isinstance(value, dict) else list(value)
