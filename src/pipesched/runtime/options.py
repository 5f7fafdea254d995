"""The run knobs of a PipelineRuntime, in one frozen value instead of loose parameters.

The model's facts (block counts, tied weights, a sample context, a tensor-parallel plan) are the
model's value's (:class:`~.stages.staged_model.StagedModel`). ``RuntimeOptions`` still takes them
as keywords, deprecated: :func:`runtime_arguments` moves them onto the model, warning once per
runtime, as it does the older positional form of ``PipelineRuntime``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any, Iterable, Optional, Sequence, Union

import torch

from ..bounds import DEFAULT_TIMEOUT_S
from ..errors import ConfigError
from .comm.mesh import check_timeout
from .stages.staged_model import FACTS, StagedModel


@dataclass(frozen=True)
class RuntimeOptions:
    """How a :class:`~pipesched.runtime.executor.PipelineRuntime` runs (the same on every rank).

    - ``seed``: block ``i`` is built after ``torch.manual_seed(seed + i)``.
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
    - ``interleave_pairs``: under expert parallelism, an overlapped pair's halves interleaved at
      their all-to-alls, one half's exchange in flight while the other computes (bitwise the same
      result; :mod:`~.engine.pair_turns`); False runs them one after the other.
    - ``reshard_after_forward``: a sharded stage frees its gathered parameters after each forward
      and gathers them again for the backward (memory for time); False (default, torchtitan's
      under pipelining) keeps them gathered from its ``UNSHARD`` to its ``RESHARD``.
    - ``meter_every_step``: count activation bytes on every step. By default the meter counts the
      first step and each step whose batch shapes change (what the memory model's prediction is
      checked against); its saved-tensor hooks cost a few percent of a small model's step.

    Deprecated: ``block_counts``, ``tied``, ``sample_context`` and ``tp_plan``, the model's facts
    (:class:`~.stages.staged_model.StagedModel`'s now).
    """

    seed: int = 0
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
    interleave_pairs: bool = True
    meter_every_step: bool = False
    reshard_after_forward: bool = False
    # deprecated: the model's facts (StagedModel's), moved onto it by runtime_arguments
    block_counts: Optional[Sequence[int]] = None
    tied: Optional[Sequence[Sequence[str]]] = None
    sample_context: Optional[dict] = None
    tp_plan: Optional[dict] = None

    def __post_init__(self) -> None:
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ConfigError(f"the gradient norm to clip to must be above 0, got {self.clip_grad_norm:g}")
        check_timeout(self.timeout_s)  # finite, above 0: every wait and collective is bounded by it

    @property
    def model_facts(self) -> dict[str, Any]:
        """The deprecated model facts these options were given (name -> value)."""
        return {name: getattr(self, name) for name in FACTS if getattr(self, name) is not None}

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device) if self.device is not None else torch.device("cpu")


def runtime_arguments(model: Any, schedule: Any, loss_fn: Any, optimizer: Any, older: tuple,
                      options: RuntimeOptions) -> tuple[StagedModel, Any, Any, Any, RuntimeOptions]:
    """``PipelineRuntime``'s (model, schedule, loss function, optimizer factory, options): as given,
    or from the older form ``(build_block, num_blocks, schedule, loss_fn, optimizer, sample_input)``;
    model facts given to the options move onto the model. Either older way warns (DeprecationWarning)."""
    if not isinstance(model, StagedModel):
        if len(older) != 2:
            raise TypeError("PipelineRuntime takes (model, schedule, loss_fn, optimizer): model a StagedModel")
        warnings.warn("PipelineRuntime(build_block, num_blocks, schedule, loss_fn, optimizer, sample_input) is "
                      "deprecated: pass StagedModel(build_block, num_blocks, sample_input) first, then the schedule, "
                      "the loss function and the optimizer", DeprecationWarning, stacklevel=3)
        (build_block, num_blocks, schedule, loss_fn), (optimizer, sample_input) = (model, schedule, loss_fn, optimizer), older
        model = StagedModel(build_block, num_blocks, sample_input)
    elif older:
        raise TypeError(f"PipelineRuntime takes 4 positional arguments, {4 + len(older)} were given")
    facts = options.model_facts
    if facts:
        both = [name for name in facts if getattr(model, name) != getattr(StagedModel, name)]
        if both:
            raise ConfigError(f"{', '.join(both)} given twice, to the model and to RuntimeOptions: give them to the model")
        warnings.warn(f"RuntimeOptions({', '.join(facts)}=...) is deprecated: the model's facts are "
                      "StagedModel's (StagedModel(build_block, num_blocks, sample_input, ...))", DeprecationWarning,
                      stacklevel=3)
        model, options = replace(model, **facts), replace(options, **dict.fromkeys(facts))
    return model, schedule, loss_fn, optimizer, options
