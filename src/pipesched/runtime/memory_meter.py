"""Activation bytes a rank holds, counted as it runs: what the memory model's promise is checked against.

Counted: every tensor autograd saves for a backward (through
``torch.autograd.graph.saved_tensors_hooks``: released when the backward frees its graph), the
tensors stashed for ``W``, and the stage inputs held from a forward to its backward. Parameters
are not activations and are left out. Tensors are counted by the bytes of their storage they
span, each byte once however many views or holders share it, so a Linear's saved input and the
same input in the W stash count once.

A recomputed stage (activation checkpointing) saves nothing in its forward; while
``torch.utils.checkpoint`` rebuilds it in the backward, :meth:`ActivationMeter.recomputation`
counts every tensor the rebuild creates until its storage is freed (checkpoint holds the rebuilt
activations in its own hooks, which no saved-tensors hook of ours can see).

Each holder is a small object whose release (when the last reference to it goes, which is when
autograd frees a saved tensor) gives its bytes back. Python bookkeeping only; no device sync.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _span(tensor: torch.Tensor, storage: int) -> tuple[int, int, int]:
    """(storage key, first byte, end byte) of the region of ``storage`` that ``tensor`` spans."""
    item = tensor.element_size()
    start = tensor.storage_offset() * item
    numel = tensor.numel()
    if numel == 0:
        return storage, start, start
    if tensor.is_contiguous():
        return storage, start, start + numel * item
    extent = 1 + sum((n - 1) * abs(st) for n, st in zip(tensor.shape, tensor.stride()))
    return storage, start, start + extent * item


def _union(intervals: dict[tuple[int, int], int]) -> int:
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


class Held:
    """One holder's claim on a tensor's bytes; dropping the object releases them."""

    __slots__ = ("meter", "tensor", "key", "__weakref__")

    def __init__(self, meter: "ActivationMeter", tensor: torch.Tensor, storage: Optional[int] = None) -> None:
        self.meter = meter
        self.tensor = tensor
        self.key = _span(tensor, tensor.untyped_storage().data_ptr() if storage is None else storage)
        meter._add(self.key)

    @property
    def nbytes(self) -> int:
        return self.key[2] - self.key[1]

    def __del__(self) -> None:
        self.meter._remove(self.key)


class ActivationMeter:
    """Bytes held now and their peak since the last :meth:`reset_peak`."""

    def __init__(self, exclude: list[torch.Tensor] = ()) -> None:
        self._excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self._storages: dict[int, dict[tuple[int, int], int]] = {}
        self._bytes: dict[int, int] = {}
        self.current = 0
        self.peak = 0
        self.high = 0  # the highest since whoever reads it last set it (the executor: per action)

    def hold(self, tensor: torch.Tensor) -> Held:
        """Count ``tensor`` until the returned holder is dropped."""
        return Held(self, tensor)

    def reset_peak(self) -> None:
        self.peak = self.current

    @contextmanager
    def saved_tensors(self) -> Iterator[None]:
        """Count what autograd saves for backward inside this block (parameters excepted)."""
        excluded = self._excluded

        def pack(tensor: torch.Tensor):
            storage = tensor.untyped_storage().data_ptr()
            if storage in excluded:
                return tensor
            return Held(self, tensor.detach(), storage)  # an alias: the caller may swap the original's data

        def unpack(packed):
            return packed.tensor if isinstance(packed, Held) else packed

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield

    def recomputation(self) -> "_CountRebuilt":
        """A context in which every new tensor storage counts until it is freed (for
        ``torch.utils.checkpoint``'s ``context_fn``: the recomputation's context)."""
        return _CountRebuilt(self)

    def _add(self, key: tuple[int, int, int]) -> None:
        storage, start, end = key
        if end <= start:
            return
        intervals = self._storages.setdefault(storage, {})
        intervals[(start, end)] = intervals.get((start, end), 0) + 1
        self._update(storage, intervals)

    def _remove(self, key: tuple[int, int, int]) -> None:
        storage, start, end = key
        if end <= start:
            return
        intervals = self._storages[storage]
        count = intervals[(start, end)] - 1
        if count:
            intervals[(start, end)] = count
        else:
            del intervals[(start, end)]
        if not intervals:
            del self._storages[storage]
        self._update(storage, intervals)

    def _update(self, storage: int, intervals: dict) -> None:
        if len(intervals) == 1:
            (start, end), = intervals
            new = end - start
        else:
            new = _union(intervals) if intervals else 0
        self.current += new - self._bytes.get(storage, 0)
        if new:
            self._bytes[storage] = new
        else:
            self._bytes.pop(storage, None)
        if self.current > self.high:
            self.high = self.current
            if self.current > self.peak:
                self.peak = self.current


class _CountRebuilt(TorchDispatchMode):
    """Counts the outputs of every op run inside it, each until its storage dies; views (of a
    weight, of the stage input) allocate nothing and add nothing."""

    def __init__(self, meter: ActivationMeter) -> None:
        super().__init__()
        self.meter = meter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                self._count(tensor)
        return out

    def _count(self, tensor: torch.Tensor) -> None:
        if tensor._is_view():
            return
        storage = tensor.untyped_storage()
        key = _span(tensor, storage.data_ptr())
        if key[0] in self.meter._storages or key[0] in self.meter._excluded or key[2] <= key[1]:
            return
        self.meter._add(key)
        weakref.finalize(storage, self.meter._remove, key)
