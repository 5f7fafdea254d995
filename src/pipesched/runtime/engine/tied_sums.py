"""A tied weight held on several stages of one rank: each stage's share of its gradient summed
apart, then the shares added in one fixed order, so the sum's bits do not depend on the schedule.

On a V placement the embedding (stage 0) and the head (the last stage) of a tied model are one
``Parameter`` on rank 0 (:mod:`..comm.tied`). Left to autograd, its gradient would be the
embedding's and the head's per-microbatch terms added in the order the schedule runs their
backwards (the head's ``W`` of microbatch 0, another microbatch's ``I`` of the embedding, ...),
while a loop placement sums each holder's terms on its own rank and the all-reduce adds the two
sums: the same terms in another order, other bits (1e-17 in float64), so weights trained with
one seed would differ between schedules. Here each stage's backwards (``B``, ``I``, ``W``)
accumulate into that stage's own sum, in the order of its microbatches as on a rank of its own,
and at the stage's ``REDUCE_GRAD`` (before the group's reduction starts) that was the last of
the group's stages on this rank, the sums are added in the group's order (its first name's
stage first): what the all-reduce of two holders' sums computes (``a + b == b + a`` exactly).

Only whole stages: a sharded stage's gradients are FSDP's (its unsharded parameters') to hold.
So a whole stage's part in its rank's program (:class:`WholeStage`) is its share of these sums.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Iterator, Optional, Sequence

import torch
from torch import nn

from ..comm.tied import locate


class TiedSums:
    """Per tied group held on two or more of ``stages`` (this rank's): its ``Parameter`` and the
    stages in the group's order; each stage's running sum during a step."""

    def __init__(self, stages: dict[int, nn.Module], tied: Sequence[Sequence[str]]) -> None:
        self._groups: list[tuple[nn.Parameter, tuple[int, ...]]] = []
        for names in tied:
            places = [place for name in names for place in locate(stages, name)]
            order = tuple(dict.fromkeys(s for s, _, _ in places))
            if len(order) > 1:
                _, module, attr = places[0]
                self._groups.append((getattr(module, attr), order))
        self._of_stage: dict[int, list[int]] = {}
        for g, (_, order) in enumerate(self._groups):
            for s in order:
                self._of_stage.setdefault(s, []).append(g)
        self._sums: list[dict[int, Optional[torch.Tensor]]] = [{} for _ in self._groups]
        self._left: list[set[int]] = [set() for _ in self._groups]
        self.clear()

    def clear(self) -> None:
        """Forget what a step left (one cut short by an error): the next step starts from none."""
        for g, (_, order) in enumerate(self._groups):
            self._sums[g].clear()
            self._left[g] = set(order)

    @contextmanager
    def stage(self, s: int) -> Iterator[None]:
        """Around a backward action of stage ``s``: the tied parameters' ``.grad`` is the stage's
        own sum while it runs."""
        groups = self._of_stage.get(s, ())
        outside = []
        for g in groups:
            param = self._groups[g][0]
            outside.append(param.grad)
            param.grad = self._sums[g].pop(s, None)
        try:
            yield
        finally:
            for g, grad in zip(groups, outside):
                param = self._groups[g][0]
                self._sums[g][s] = param.grad
                param.grad = grad

    def reduced(self, s: int) -> None:
        """Stage ``s``'s ``REDUCE_GRAD``: a group whose stages on this rank are all done gets its
        gradient, the stages' sums added in the group's order (onto what ``.grad`` held before)."""
        for g in self._of_stage.get(s, ()):
            left = self._left[g]
            left.discard(s)
            if left:
                continue
            param, order = self._groups[g]
            sums = self._sums[g]
            for stage in order:
                share = sums.pop(stage, None)
                if share is None:
                    continue
                if param.grad is None:
                    param.grad = share
                else:
                    param.grad.add_(share)
            left.update(order)


class WholeStage:
    """A whole stage's :class:`~.stage_runner.StagePart`: nothing to gather, free or reduce-scatter
    (its replicas' all-reduce is the reduction plan's); its backwards go into its own share of
    the rank's tied weights (``sums``), added at its ``REDUCE_GRAD``."""

    def __init__(self, index: int, sums: TiedSums) -> None:
        self.index, self.sums = index, sums

    def unshard(self) -> None:
        """Nothing to gather: a whole stage holds its parameters."""

    def ready(self) -> None:
        """Nothing to wait for."""

    def reshard(self) -> None:
        """Nothing to free."""

    def forward(self) -> AbstractContextManager:
        return nullcontext()

    def backward(self) -> AbstractContextManager:
        return self.sums.stage(self.index)

    def reduce_grad(self) -> None:
        self.sums.reduced(self.index)


def whole_parts(stages: dict[int, nn.Module], sums: Optional[TiedSums] = None) -> dict[int, WholeStage]:
    """Each of ``stages``' part as a whole stage, sharing ``sums`` (default: no tied weight)."""
    sums = sums if sums is not None else TiedSums(stages, ())
    return {s: WholeStage(s, sums) for s in stages}
