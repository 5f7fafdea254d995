"""The blocks a Hugging Face decoder is cut into: embeddings, one block per decoder layer, head.

Each block maps one tensor to one tensor (token ids to the hidden state, hidden state to hidden
state, hidden state to logits), so any contiguous run of them is a pipeline stage and only the
hidden state crosses a stage boundary. What a layer needs besides the hidden state (position
ids, the attention mask, the rotary tables) it builds itself, on the hidden state's device, from
the side inputs of the microbatch being computed (its ``context`` argument, which the runtime
passes: :mod:`pipesched.runtime.batch_context`): no mask or table is ever sent, so none needs a
gradient message. The mask is chosen by the layer's own type (full or
sliding-window attention, ``config.layer_types[index]``), never by its position in a stage, and
built with transformers' own ``create_causal_mask`` / ``create_sliding_window_causal_mask``.

A block registers the model's modules under the model's own names (``model.layers.3.mlp...``),
so a stage's parameter ``"4.model.layers.3.mlp.up_proj.weight"`` is the model's
``"model.layers.3.mlp.up_proj.weight"`` behind the block index.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .architectures import Architecture


def graft(root: nn.Module, path: str, module: nn.Module) -> None:
    """Register ``module`` under the dotted ``path`` of ``root``, creating empty parents."""
    *parents, leaf = path.split(".")
    node = root
    for name in parents:
        child = getattr(node, name, None)
        if child is None:
            child = nn.Module()
            node.add_module(name, child)
        node = child
    node.add_module(leaf, module)


def position_ids(side: dict, like: torch.Tensor) -> torch.Tensor:
    """The batch's position ids, or 0..S-1 (what the model uses without them), on ``like``'s device."""
    given = side.get("position_ids")
    if given is not None:
        return given.to(like.device)
    return torch.arange(like.shape[1], device=like.device).unsqueeze(0)


def layer_type(config, index: int) -> str:
    """``full_attention`` or ``sliding_attention`` for decoder layer ``index``, as the model picks it."""
    types = getattr(config, "layer_types", None)
    if types:
        return types[index]
    return "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"


class EmbeddingBlock(nn.Module):
    """Token ids to the first hidden state (with learned positions and dropout where the model has them)."""

    def __init__(self, arch: Architecture, parts: dict[str, nn.Module]) -> None:
        super().__init__()
        for path in arch.embeddings:
            graft(self, path, parts[path])
        self._parts = (parts[arch.token_embedding],
                       parts.get(arch.learned_positions) if arch.learned_positions else None,
                       parts.get(arch.dropout) if arch.dropout else None)

    def forward(self, input_ids: torch.Tensor, context: Optional[dict] = None) -> torch.Tensor:
        tokens, positions, dropout = self._parts
        hidden = tokens(input_ids)
        if positions is not None:
            hidden = hidden + positions(position_ids(context or {}, input_ids))
        return dropout(hidden) if dropout is not None else hidden


class LayerBlock(nn.Module):
    """One decoder layer, given the mask of its own type, the positions and the rotary tables."""

    def __init__(self, arch: Architecture, config, index: int, layer: nn.Module, rotary: Optional[nn.Module]) -> None:
        super().__init__()
        graft(self, f"{arch.layers}.{index}", layer)
        if rotary is not None:  # buffers only, none persistent: in no state dict
            graft(self, arch.rotary, rotary)
        self.config = config
        self.layer_type = layer_type(config, index)
        self._parts = (layer, rotary)

    def forward(self, hidden: torch.Tensor, context: Optional[dict] = None) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        if hidden.is_meta:  # shape inference: a layer keeps the hidden state's shape (and masks,
            return torch.empty_like(hidden)  # MoE routing read values, which meta has not)
        layer, rotary = self._parts
        side = context or {}
        positions = position_ids(side, hidden)
        make_mask = create_sliding_window_causal_mask if self.layer_type == "sliding_attention" else create_causal_mask
        mask = make_mask(config=self.config, inputs_embeds=hidden, attention_mask=side.get("attention_mask"),
                         cache=None, position_ids=positions)
        extra = {"position_embeddings": rotary(hidden, positions)} if rotary is not None else {}
        out = layer(hidden, attention_mask=mask, position_ids=positions, use_cache=False, **extra)
        return out[0] if isinstance(out, tuple) else out


class HeadBlock(nn.Module):
    """The final norm and the language-model head: hidden state to logits."""

    def __init__(self, arch: Architecture, parts: dict[str, nn.Module]) -> None:
        super().__init__()
        for path in arch.final:
            graft(self, path, parts[path])
        self._parts = tuple(parts[path] for path in arch.final)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for module in self._parts:
            hidden = module(hidden)
        return hidden


def model_blocks(model: nn.Module, arch: Architecture) -> list[nn.Module]:
    """``model``'s blocks, in order, sharing its modules (no copy)."""
    config = model.config
    parts = dict(model.named_modules())
    layers = parts[arch.layers]
    rotary = parts[arch.rotary] if arch.rotary else None
    return [EmbeddingBlock(arch, parts),
            *(LayerBlock(arch, config, i, layer, rotary) for i, layer in enumerate(layers)),
            HeadBlock(arch, parts)]

