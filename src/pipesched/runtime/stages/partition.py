"""Cut a model given as ordered blocks into pipeline stages; a rank builds only the blocks it owns.

Block ``i`` is built right after ``torch.manual_seed(seed + i)``, so its initial weights are the
same on whichever rank builds it and in the single-process reference. Parameter names are those
of the unpipelined ``nn.Sequential`` (``"3.fc1.weight"``), so state dicts line up.
"""

from __future__ import annotations

import copy
import inspect
import itertools
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from ...balance import balanced_counts, even_counts  # noqa: F401  (copies.py takes the rule from here)
from ...errors import ConfigError

BlockBuilder = Callable[[int], nn.Module]
BlockRun = Callable[[nn.Module, object, Optional[dict], bool], object]  # (block, x, context, takes) -> y


def build_block_seeded(build_block: BlockBuilder, index: int, seed: int) -> nn.Module:
    """Build block ``index`` with the seed that makes it identical wherever it is built."""
    torch.manual_seed(seed + index)
    return build_block(index)


def block_counts(num_blocks: int, stages: int, counts: Optional[Sequence[int]] = None) -> list[int]:
    """Blocks per stage: ``counts`` when given (checked), else as even as possible.

    Uneven splits give the extra blocks to the last stages (a model's last block is often a
    light head). :func:`~pipesched.balance.balanced_counts` does better when block costs can be estimated.
    """
    if counts is not None:
        counts = list(counts)
        if len(counts) != stages or any(c < 1 for c in counts) or sum(counts) != num_blocks:
            raise ConfigError(
                f"block counts {counts} do not fit: give {stages} counts of at least 1 that sum to "
                f"{num_blocks} (the model's blocks)"
            )
        return counts
    return even_counts(num_blocks, stages)


def stage_block_ranges(num_blocks: int, stages: int, counts: Optional[Sequence[int]] = None) -> list[range]:
    """The block indices of every stage, in model order."""
    ranges, start = [], 0
    for count in block_counts(num_blocks, stages, counts):
        ranges.append(range(start, start + count))
        start += count
    return ranges


def takes_context(block: nn.Module) -> bool:
    """Whether ``block.forward`` takes the microbatch's batch context (a ``context`` argument)."""
    return "context" in inspect.signature(block.forward).parameters


def run_block(block: nn.Module, x, context: Optional[dict] = None, takes: Optional[bool] = None):
    """``block(x)``, given ``context=context`` where its forward takes one (``takes``: known already)."""
    if takes if takes is not None else takes_context(block):
        return block(x, context=context)
    return block(x)


class Stage(nn.Module):
    """A contiguous run of blocks; its state dict uses the unpipelined model's names."""

    def __init__(self, index: int, blocks: dict[int, nn.Module]) -> None:
        super().__init__()
        self.index = index
        self.blocks = nn.ModuleDict({str(i): b for i, b in blocks.items()})
        self.chain = [(block, takes_context(block)) for block in self.blocks.values()]

    def forward(self, x: torch.Tensor, context: Optional[dict] = None, run: Optional[BlockRun] = None) -> torch.Tensor:
        """The blocks in order, each by ``run`` (default :func:`run_block`). Recomputation passes
        one that checkpoints each block (:mod:`~..engine.recompute`): through the stage's own call,
        so what hooks the stage (FSDP2's root, whose forward starts its groups' state) runs
        as on any forward."""
        for block, takes in self.chain:
            x = (run or run_block)(block, x, context, takes)
        return x

    def global_named_parameters(self):
        """(name in the unpipelined model, parameter) pairs; a parameter tied within the stage
        comes once under each of its names."""
        for name, param in self.blocks.named_parameters(remove_duplicate=False):
            yield name, param

    def global_state_dict(self) -> dict[str, torch.Tensor]:
        return {name: t.detach().cpu() for name, t in self.blocks.state_dict().items()}


def build_stage(build_block: BlockBuilder, blocks: range, stage: int, seed: int, device: torch.device) -> Stage:
    """Materialise one stage's blocks (and no others) on ``device``."""
    built = {i: build_block_seeded(build_block, i, seed).to(device) for i in blocks}
    return Stage(stage, built)


def meta_block(build_block: BlockBuilder, index: int) -> nn.Module:
    """Block ``index`` without storage, for shape inference (copied to meta if the builder
    returns an already materialised module, as an ``nn.Sequential`` front-end does, on whatever
    device it lives and however the runtime prepared it)."""
    with torch.device("meta"):
        block = build_block(index)
    if any(not t.is_meta for t in itertools.chain(block.parameters(), block.buffers())):
        block = copy.deepcopy(block).to("meta")
    return block


def sequential_builder(model: nn.Sequential) -> tuple[BlockBuilder, int]:
    """Use an existing ``nn.Sequential`` as blocks (each rank then keeps only its own blocks)."""
    return (lambda i: model[i]), len(model)
