"""The settings of a PipelineRuntime, in one frozen value instead of loose parameters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence, Union

import torch

from ..bounds import DEFAULT_TIMEOUT_S
from ..errors import ConfigError
from .comm.mesh import check_timeout


@dataclass(frozen=True)
class RuntimeOptions:
    """How a :class:`~pipesched.runtime.executor.PipelineRuntime` runs (the same on every rank).

    - ``seed``: block ``i`` is built after ``torch.manual_seed(seed + i)``.
    - ``block_counts``: blocks per stage of one model copy (default: even).
    - ``device``: where this rank computes (default: the CPU).
    - ``timeout_s``: how long a rank waits for a message or a collective.
    - ``skip_nonfinite``: skip a step whose loss is NaN or infinite instead of raising.
    - ``sync_actions``: on CUDA, True synchronises after every action, False records host times
      only, None (default) times actions with CUDA events.
    - ``host_staging``: pass messages through host memory (default: on a GPU over gloo).
    - ``clip_grad_norm``: clip the whole model's gradient norm, over every rank.
    - ``recompute``: the model stages recomputed in the backward: ``"all"``, ``"none"`` or indices.
    - ``dtype``: ``torch.bfloat16`` computes under autocast and sends bf16 boundaries.
    - ``overlap_grad_sync``: start each gradient reduction as soon as its last gradient is done
      (False: all after the step's last action).
    - ``overlap_streams``: on CUDA, an overlapped pair's forward half on a stream of its own.
    - ``tied``: groups of parameter names (as ``named_parameters()`` yields them, the unpipelined
      model's) that are one weight, e.g. ``(("0.wte.weight", "5.head.weight"),)``; the first
      name's initial value is the group's.
    - ``sample_context``: one microbatch's batch context (:mod:`~pipesched.runtime.stages.batch_context`)
      for shape inference, when the blocks read one.
    - ``tp_plan``: with tensor parallelism (a :class:`~.sharded_mesh.ShardedMesh` whose ``tp`` is
      above 1), which sub-modules split column- or row-wise (:mod:`.sharding.model_plans`: ``plan_for(name, config)``).
    - ``reshard_after_forward``: a sharded stage frees its gathered parameters after each forward
      and gathers them again for the backward (memory for time); False (default, torchtitan's
      under pipelining) keeps them gathered from its ``UNSHARD`` to its ``RESHARD``.
    - ``meter_every_step``: count activation bytes on every step. By default the meter counts the
      first step and each step whose batch shapes change (what the memory model's prediction is
      checked against); its saved-tensor hooks cost a few percent of a small model's step.
    """

    seed: int = 0
    block_counts: Optional[Sequence[int]] = None
    device: Optional[Union[str, torch.device]] = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    skip_nonfinite: bool = False
    sync_actions: Optional[bool] = None
    host_staging: Optional[bool] = None
    clip_grad_norm: Optional[float] = None
    recompute: Union[str, Iterable[int], None] = None
    dtype: torch.dtype = torch.float32
    overlap_grad_sync: bool = True
    overlap_streams: bool = False
    tied: Sequence[Sequence[str]] = field(default_factory=tuple)
    sample_context: Optional[dict] = None
    meter_every_step: bool = False
    tp_plan: Optional[dict] = None
    reshard_after_forward: bool = False

    def __post_init__(self) -> None:
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ConfigError(f"the gradient norm to clip to must be above 0, got {self.clip_grad_norm:g}")
        check_timeout(self.timeout_s)  # finite, above 0: every wait and collective is bounded by it
        tied = tuple(tuple(group) for group in self.tied)
        for group in tied:
            if len(group) < 2 or len(set(group)) != len(group):
                raise ConfigError(f"a tied group names two or more distinct parameters, got {list(group)}")
        names = [n for group in tied for n in group]
        if len(set(names)) != len(names):
            raise ConfigError("a parameter is named in two tied groups: merge them into one")
        object.__setattr__(self, "tied", tied)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device) if self.device is not None else torch.device("cpu")
