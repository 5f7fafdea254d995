"""The blocks a Hugging Face decoder is cut into: embeddings, one block per decoder layer, head.

Each block maps one tensor to one tensor (token ids to the hidden state, hidden state to hidden
state, hidden state to logits), so any contiguous run of them is a pipeline stage and only the
hidden state crosses a stage boundary. What a layer needs besides the hidden state (position
ids, the attention mask, the rotary tables) it builds itself, on the hidden state's device, from
the side inputs of the microbatch being computed (its ``context`` argument, which the runtime
passes: :mod:`pipesched.runtime.stages.batch_context`): no mask or table is ever sent, so none needs a
gradient message. The mask is chosen by the layer's own type (full or
sliding-window attention, ``config.layer_types[index]``), never by its position in a stage, and
built with transformers' own ``create_causal_mask`` / ``create_sliding_window_causal_mask``,
from real tensors even where the hidden state is fake (the activations ``train --memory-limit``
predicts on fake tensors, :mod:`pipesched.runtime.engine.sizes_ahead`): transformers reads the
positions' and the padding's values to choose the mask (none and SDPA's causal kernel with grouped
keys, or an explicit mask and keys repeated per head), and takes a fake tensor for a traced one,
whose values it cannot read, so a mask built on fake tensors would not be the run's.
Whatever a block draws (dropout, router noise) it draws keyed by its index and the microbatch
(:mod:`.randomness`), so the schedule never changes it.

A block registers the model's modules under the model's own names (``model.layers.3.mlp...``),
so a stage's parameter ``"4.model.layers.3.mlp.up_proj.weight"`` is the model's
``"model.layers.3.mlp.up_proj.weight"`` behind the block index.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .architectures import Architecture
from .randomness import keyed_draws


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
    """Token ids to the first hidden state: the token embedding, then the learned positions, the
    family's own steps (a multiplier, a dropout) and the dropout module, where it has them."""

    def __init__(self, arch: Architecture, config, parts: dict[str, nn.Module]) -> None:
        super().__init__()
        for path in arch.embeddings:
            graft(self, path, parts[path])
        self.config = config
        self.steps = arch.embedding_steps
        self._parts = (parts[arch.token_embedding],
                       parts.get(arch.learned_positions) if arch.learned_positions else None,
                       parts.get(arch.dropout) if arch.dropout else None)

    def forward(self, input_ids: torch.Tensor, context: Optional[dict] = None) -> torch.Tensor:
        tokens, positions, dropout = self._parts
        side = context or {}
        hidden = tokens(input_ids)
        if positions is not None:
            hidden = hidden + positions(position_ids(side, input_ids))
        with keyed_draws(side, 0, hidden):
            for step in self.steps:
                hidden = step.apply(hidden, self.config, self.training)
            return dropout(hidden) if dropout is not None else hidden


class LayerBlock(nn.Module):
    """One decoder layer, given the mask of its own type, the positions and the rotary tables."""

    def __init__(self, arch: Architecture, config, index: int, layer: nn.Module, rotary: Optional[nn.Module]) -> None:
        super().__init__()
        graft(self, f"{arch.layers}.{index}", layer)
        if rotary is not None:  # buffers only, none persistent: in no state dict
            graft(self, arch.rotary, rotary)
        self.config = config
        self.index = index
        self.layer_type = layer_type(config, index)
        self.rotary_by_layer_type = arch.rotary_by_layer_type
        self.arguments = dict(arch.layer_arguments)
        self._parts = (layer, rotary)

    def forward(self, hidden: torch.Tensor, context: Optional[dict] = None) -> torch.Tensor:
        from transformers.masking_utils import (
            create_causal_mask,
            create_sliding_window_causal_mask,
        )

        if hidden.is_meta:  # shape inference: a layer keeps the hidden state's shape (and masks,
            return torch.empty_like(hidden)  # MoE routing read values, which meta has not)
        layer, rotary = self._parts
        side = context or {}
        make_mask = create_sliding_window_causal_mask if self.layer_type == "sliding_attention" else create_causal_mask
        with unset_fake_temporarily():  # the batch's values choose the mask (module doc)
            positions = position_ids(side, hidden)
            mask = make_mask(config=self.config, inputs_embeds=hidden, attention_mask=side.get("attention_mask"),
                             cache=None, position_ids=positions)
        extra = {}
        if rotary is not None:
            by_type = (self.layer_type,) if self.rotary_by_layer_type else ()
            extra["position_embeddings"] = rotary(hidden, positions, *by_type)
        with keyed_draws(side, self.index + 1, hidden):
            out = layer(hidden, attention_mask=mask, position_ids=positions, use_cache=False, **self.arguments, **extra)
        return out[0] if isinstance(out, tuple) else out


class HeadBlock(nn.Module):
    """The final norm and the language-model head, then the family's own steps on the logits (a
    scale, a soft-cap): hidden state to logits."""

    def __init__(self, arch: Architecture, config, parts: dict[str, nn.Module], index: int) -> None:
        super().__init__()
        for path in arch.final:
            graft(self, path, parts[path])
        self.config = config
        self.steps = arch.logit_steps
        self._parts = tuple(parts[path] for path in arch.final)
        self.index = index

    def forward(self, hidden: torch.Tensor, context: Optional[dict] = None) -> torch.Tensor:
        with keyed_draws(context or {}, self.index, hidden):
            for module in self._parts:
                hidden = module(hidden)
            for step in self.steps:
                hidden = step.apply(hidden, self.config, self.training)
        return hidden


def model_blocks(model: nn.Module, arch: Architecture) -> list[nn.Module]:
    """``model``'s blocks, in order, sharing its modules (no copy)."""
    config = model.config
    parts = dict(model.named_modules())
    layers = parts[arch.layers]
    rotary = parts[arch.rotary] if arch.rotary else None
    return [EmbeddingBlock(arch, config, parts),
            *(LayerBlock(arch, config, i, layer, rotary) for i, layer in enumerate(layers)),
            HeadBlock(arch, config, parts, len(layers) + 1)]

