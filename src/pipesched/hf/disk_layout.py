"""The model's tensors as a checkpoint folder stores them, by transformers' own loading rules.

transformers keeps some weights in memory in another layout than on disk: an MoE layer's
experts are one fused tensor in the model (``mlp.experts.gate_up_proj``, ``[E, 2I, H]``) and one
Linear per expert in every checkpoint (``block_sparse_moe.experts.3.w1.weight`` for Mixtral,
``mlp.experts.3.gate_proj.weight`` for Qwen-MoE); its ``save_pretrained`` writes the disk
layout and ``from_pretrained`` converts it back. :class:`DiskLayout` applies the same
conversion, read from transformers' own table (``get_model_conversion_mapping``: its renamings
and its converters with their operations), so a rank builds each of its tensors from the stored
ones without a hand-written rename. A folder already in the in-memory layout reads as it is.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch
from torch import nn

Reader = Callable[[str], torch.Tensor]  # a stored key -> its tensor (real, or on meta for shapes)


class DiskLayout:
    """Which stored keys each of the model's tensors is built from, and how."""

    def __init__(self, model: nn.Module, stored: Iterable[str]) -> None:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, dot_natural_key, rename_source_key

        transforms = get_model_conversion_mapping(model)
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
        renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
        expected = model.state_dict()
        self.sources: dict[str, tuple[Optional[WeightConverter], dict[str, list[str]]]] = {}
        for key in sorted(stored, key=dot_natural_key):  # experts in their index order, as transformers stacks them
            name, pattern = rename_source_key(key, renamings, converters, model.base_model_prefix, expected)
            converter = next((c for c in converters if pattern in c.source_patterns), None) if pattern else None
            _, groups = self.sources.setdefault(name, (converter, {}))
            groups.setdefault(pattern, []).append(key)
        self.config = model.config

    def __contains__(self, name: str) -> bool:
        return name in self.sources

    def build(self, name: str, read: Reader) -> torch.Tensor:
        """The model's tensor ``name`` from the stored tensors ``read`` returns."""
        converter, groups = self.sources[name]
        if converter is None:
            (key,) = groups[None]
            return read(key)
        collected = {pattern: [read(key) for key in keys] for pattern, keys in groups.items()}
        for operation in converter.operations:
            collected = operation.convert(collected, source_patterns=converter.source_patterns,
                                          target_patterns=converter.target_patterns, full_layer_name=name,
                                          config=self.config, model=None, missing_keys=None)
        (tensor,) = collected.values()
        return tensor
