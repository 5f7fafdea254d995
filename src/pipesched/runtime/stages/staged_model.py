"""A model as the runtime stages it: how to build each block, and the facts about those blocks.

Which blocks each stage holds (``block_counts``), which parameters are one weight (``tied``),
what a block reads besides its input (``sample_context``, for shape inference) and how tensor
parallelism splits its modules (``tp_plan``) are the model's facts: every rank must agree on them,
whatever the run's knobs (:class:`~pipesched.runtime.options.RuntimeOptions`: seed, device,
precision, clipping, ...). They travel with the blocks in one value, built once where a run is
assembled (the CLI, :mod:`pipesched.training.train`, :func:`pipesched.hf.pipeline`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ...errors import ConfigError
from ...expert_plans import ExpertPlan
from .boundary import Value
from .partition import BlockBuilder, stage_block_ranges

FACTS = ("block_counts", "tied", "sample_context", "tp_plan")  # what RuntimeOptions once carried


@dataclass(frozen=True)
class StagedModel:
    """The blocks ``build_block(0) .. build_block(num_blocks - 1)`` (an ``nn.Sequential``'s order)
    and their facts, for :class:`~pipesched.runtime.executor.PipelineRuntime`.

    - ``sample_input``: one microbatch's input (only its shape and dtype matter, unless the
      blocks cannot run on ``meta``: then one real forward of it infers the boundary shapes).
    - ``block_counts``: blocks per stage of one model copy (default: even).
    - ``tied``: groups of parameter names (as ``named_parameters()`` yields them, the unpipelined
      model's) that are one weight, e.g. ``(("0.wte.weight", "5.head.weight"),)``; the first
      name's initial value is the group's.
    - ``sample_context``: one microbatch's batch context (:mod:`~pipesched.runtime.stages.batch_context`)
      for shape inference, when the blocks read one.
    - ``tp_plan``: with tensor parallelism (a ``ShardedMesh`` whose ``tp`` is above 1), which
      sub-modules split column- or row-wise (:mod:`~pipesched.runtime.sharding.model_plans`: ``plan_for(name, config)``).
    - ``expert_plan``: with expert parallelism (a mesh whose ``experts`` is set), which experts
      modules split their experts (:mod:`~pipesched.expert_plans`: ``expert_plan_for(name, config)``).
    """

    build_block: BlockBuilder
    num_blocks: int
    sample_input: Value
    block_counts: Optional[Sequence[int]] = None
    tied: Sequence[Sequence[str]] = ()
    sample_context: Optional[dict] = None
    tp_plan: Optional[dict] = None
    expert_plan: Optional[ExpertPlan] = None

    def __post_init__(self) -> None:
        tied = tuple(tuple(group) for group in self.tied)
        for group in tied:
            if len(group) < 2 or len(set(group)) != len(group):
                raise ConfigError(f"a tied group names two or more distinct parameters, got {list(group)}")
        names = [n for group in tied for n in group]
        if len(set(names)) != len(names):
            raise ConfigError("a parameter is named in two tied groups: merge them into one")
        object.__setattr__(self, "tied", tied)

    def stage_ranges(self, stages: int) -> list[range]:
        """The blocks of each of one model copy's ``stages`` stages, in model order."""
        return stage_block_ranges(self.num_blocks, stages, self.block_counts)
