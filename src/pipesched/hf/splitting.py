"""transformers' ``Conv1D`` (GPT-2's projections, a Linear with its weight stored transposed)
registered with the runtime's split backward, so zero-bubble schedules defer its weight gradients."""

from __future__ import annotations


def prepare_split_backward() -> None:
    from transformers.pytorch_utils import Conv1D

    from ..runtime.engine.split_backward import register_transposed_linear

    register_transposed_linear(Conv1D)
