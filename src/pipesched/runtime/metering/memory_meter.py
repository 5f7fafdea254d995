"""Activation bytes a rank holds, counted as it runs: what the memory model's promise is checked against.

Counted: every tensor autograd saves for a backward (through
``torch.autograd.graph.saved_tensors_hooks``: released when the backward frees its graph), the
tensors stashed for ``W``, and the stage inputs held from a forward to its backward. Parameters
are not activations and are left out. Under tensor parallelism autograd saves DTensors (a split
Linear's input, replicated or sharded): each counts its local piece, what the rank holds, and a
weight's (its storage excluded) nothing. Tensors are counted by the bytes of their storage they
span, each byte once however many views or holders share it, so a Linear's saved input and the
same input in the W stash count once. A storage is known by its identity (``_cdata``, the
address of torch's ``StorageImpl``), not by its data pointer: fake tensors have none, and they
are metered as real ones are (:mod:`pipesched.runtime.engine.sizes_ahead`).

A recomputed stage (activation checkpointing) saves nothing in its forward; while
``torch.utils.checkpoint`` rebuilds it in the backward, :meth:`ActivationMeter.recomputation`
counts every tensor the rebuild creates until its storage is freed (checkpoint holds the rebuilt
activations in its own hooks, which no saved-tensors hook of ours can see), and
:meth:`ActivationMeter.count_until_freed` the block inputs checkpoint keeps for the rebuild.

Each holder is a small :class:`Claim` whose release (when the last reference to it goes, which
is when autograd frees a saved tensor) gives its bytes back. It runs for every saved tensor of
every step, so it is kept to the least Python work: one pack call and one claim per saved
tensor, the hooks built once, and the span arithmetic of a storage only when a second distinct
span of it is held (the common case, one storage held by one or several holders of the same
span, is a dictionary lookup). Python bookkeeping only; no device sync.
"""

from __future__ import annotations

import weakref
from typing import Iterable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    """(first byte, end byte) of the region of its storage that ``tensor`` spans."""
    item = tensor.element_size()
    start = tensor.storage_offset() * item
    if tensor.is_contiguous():
        return start, start + tensor.numel() * item
    if tensor.numel() == 0:
        return start, start
    extent = 1 + sum((n - 1) * abs(st) for n, st in zip(tensor.shape, tensor.stride()))
    return start, start + extent * item


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """What this rank holds of ``tensor``: a DTensor's local piece, else the tensor itself."""
    return getattr(tensor, "_local_tensor", tensor)


def _union(spans: dict[tuple[int, int], int]) -> int:
    """Bytes covered by the spans (each byte once)."""
    total, reach = 0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


class Claim:
    """One holder's claim on the bytes a tensor spans of its storage; dropping it releases them."""

    __slots__ = ("meter", "tensor", "storage", "span")

    @property
    def nbytes(self) -> int:
        return self.span[1] - self.span[0]

    def __del__(self) -> None:
        self.meter._release(self.storage, self.span)


def _unpack(packed):
    return packed.tensor if packed.__class__ is Claim else packed


class ActivationMeter:
    """Bytes held now and their peak since the last :meth:`reset_peak`."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._excluded = {_local(t).untyped_storage()._cdata for t in exclude}
        # storage -> [bytes counted, {span: holders}]
        self._held: dict[int, list] = {}
        self.current = 0
        self.peak = 0
        self.high = 0  # the highest since whoever reads it last set it (the executor: per action)
        excluded, claim = self._excluded, self._claim

        def pack(tensor: torch.Tensor):
            local = tensor if type(tensor) is torch.Tensor else _local(tensor)  # a DTensor: its local piece
            storage = local.untyped_storage()._cdata
            if storage in excluded:  # a weight (a sharded one's piece too): not an activation
                return tensor
            # a tensor with a history is held as an alias without it: holding the original would
            # tie it to its own graph in a cycle, and the executor swaps a stage output's data
            return claim(tensor if tensor.is_leaf else tensor.detach(), storage, local)

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, _unpack)

    def exclude(self, tensors: Iterable[torch.Tensor]) -> None:
        """Never count ``tensors``' storages (a DTensor's local piece's) from now on: weights, those
        a sharded stage gathered too."""
        self._excluded.update(_local(t).untyped_storage()._cdata for t in tensors)

    def hold(self, tensor: torch.Tensor) -> Claim:
        """Count ``tensor`` (a sharded one's local piece: what this rank holds) until the returned
        claim is dropped."""
        tensor = _local(tensor)
        return self._claim(tensor, tensor.untyped_storage()._cdata)

    def reset_peak(self) -> None:
        self.peak = self.current

    def saved_tensors(self) -> torch.autograd.graph.saved_tensors_hooks:
        """A context in which what autograd saves for backward counts (parameters excepted)."""
        return self._hooks

    def count_until_freed(self, tensor: torch.Tensor) -> None:
        """Count ``tensor`` until its storage is freed, whoever holds it (a checkpointed block's
        input, which ``torch.utils.checkpoint`` keeps out of any saved-tensors hook); a view, or a
        storage already counted, adds nothing."""
        if tensor._is_view():
            return
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._held or key in self._excluded:
            return
        span = _span(tensor)
        self._add(key, span)
        weakref.finalize(storage, self._release, key, span)

    def recomputation(self) -> "_CountRebuilt":
        """A context in which every new tensor storage counts until it is freed (for
        ``torch.utils.checkpoint``'s ``context_fn``: the recomputation's context)."""
        return _CountRebuilt(self)

    def _claim(self, tensor: torch.Tensor, storage: int, local: Optional[torch.Tensor] = None) -> Claim:
        """Hold ``tensor``, counting the span of ``storage`` that ``local`` (a DTensor's local
        piece; the tensor itself by default) covers."""
        claim = Claim.__new__(Claim)
        claim.meter, claim.tensor, claim.storage = self, tensor, storage
        claim.span = span = _span(tensor if local is None else local)
        self._add(storage, span)
        return claim

    def _add(self, storage: int, span: tuple[int, int]) -> None:
        record = self._held.get(storage)
        if record is None:  # the common case: a storage nobody holds yet
            grown = span[1] - span[0]
            self._held[storage] = [grown, {span: 1}]
        else:
            spans = record[1]
            holders = spans.get(span, 0)
            spans[span] = holders + 1
            if holders:
                return
            counted = _union(spans)
            grown, record[0] = counted - record[0], counted
        if grown:
            current = self.current = self.current + grown
            if current > self.high:
                self.high = current
                if current > self.peak:
                    self.peak = current

    def _release(self, storage: int, span: tuple[int, int]) -> None:
        record = self._held[storage]
        spans = record[1]
        holders = spans[span] - 1
        if holders:
            spans[span] = holders
            return
        del spans[span]
        if spans:
            counted = _union(spans)
            self.current -= record[0] - counted
            record[0] = counted
        else:
            del self._held[storage]
            self.current -= record[0]


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
                self.meter.count_until_freed(tensor)
        return out
