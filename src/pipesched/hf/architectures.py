"""Which Hugging Face causal LMs pipesched can split: each family a small declaration.

A decoder splits into ``num_hidden_layers + 2`` blocks: the embeddings, each decoder layer, and
the final norm with the head. Only the hidden state crosses from one block to the next:
positions, masks and rotary tables are rebuilt by every layer block from the batch
(:mod:`.blocks`). A family declares the module names of its parts and what its ``forward`` does
between them that no part does (:mod:`.steps`: Granite's embedding multiplier, Cohere's logit
scale, Gemma 2's soft-cap, StarCoder2's embedding dropout), and whether its rotary module takes
the layer's attention type (Gemma 3: local and global tables). Before a model is split, its
declaration is checked against the model itself on a shrunken twin of its config (:mod:`.twin`):
a registration that leaves a step out is refused, not trained wrong. A causal LM not listed
here whose modules are laid out as Llama's is split as Llama is, once its twin check passes.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Optional

from torch import nn

from ..errors import ConfigError
from . import steps
from .steps import Step


@dataclass(frozen=True)
class Architecture:
    """The module names of one family of ``*ForCausalLM`` models and its steps between them."""

    embeddings: tuple[str, ...]  # run first, in this order (token embedding first)
    layers: str  # the ModuleList of decoder layers
    final: tuple[str, ...]  # the final norm, then the head
    rotary: Optional[str] = None  # the rotary embedding every layer block rebuilds its tables with
    learned_positions: Optional[str] = None  # an embedding of position ids added to the tokens'
    dropout: Optional[str] = None  # a dropout module after the embeddings
    embedding_steps: tuple[Step, ...] = ()  # the forward's own steps on the embeddings, in order
    logit_steps: tuple[Step, ...] = ()  # the forward's own steps on the logits, in order
    rotary_by_layer_type: bool = False  # rotary(hidden, positions, layer_type): a table per type
    layer_arguments: tuple[tuple[str, object], ...] = ()  # what the forward passes every layer besides

    @property
    def token_embedding(self) -> str:
        return self.embeddings[0]

    @property
    def head(self) -> str:
        return self.final[-1]


LLAMA_LIKE = Architecture(("model.embed_tokens",), "model.layers", ("model.norm", "lm_head"), rotary="model.rotary_emb")
_GPT2 = Architecture(
    ("transformer.wte", "transformer.wpe", "transformer.drop"), "transformer.h", ("transformer.ln_f", "lm_head"),
    learned_positions="transformer.wpe", dropout="transformer.drop",
)
_GPT_NEOX = Architecture(("gpt_neox.embed_in", "gpt_neox.emb_dropout"), "gpt_neox.layers",
                         ("gpt_neox.final_layer_norm", "lm_head"), rotary="gpt_neox.rotary_emb",
                         dropout="gpt_neox.emb_dropout")
_FALCON = Architecture(("transformer.word_embeddings",), "transformer.h", ("transformer.ln_f", "lm_head"),
                       rotary="transformer.rotary_emb", layer_arguments=(("alibi", None),))  # alibi: refused by the twin
_SOFTCAPPED = (steps.softcap("final_logit_softcapping"),)

ARCHITECTURES: dict[str, Architecture] = {
    **dict.fromkeys(["LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM",
                     "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "Phi3ForCausalLM",
                     "Olmo2ForCausalLM", "DeepseekV3ForCausalLM", "GemmaForCausalLM"], LLAMA_LIKE),
    "Gemma2ForCausalLM": replace(LLAMA_LIKE, logit_steps=_SOFTCAPPED),
    "Gemma3ForCausalLM": replace(LLAMA_LIKE, logit_steps=_SOFTCAPPED, rotary_by_layer_type=True),
    "CohereForCausalLM": replace(LLAMA_LIKE, logit_steps=(steps.multiply("logit_scale"),)),
    "GraniteForCausalLM": replace(LLAMA_LIKE, embedding_steps=(steps.multiply("embedding_multiplier"),),
                                  logit_steps=(steps.divide("logits_scaling"),)),
    "Starcoder2ForCausalLM": replace(LLAMA_LIKE, embedding_steps=(steps.dropout("embedding_dropout"),)),
    "GPTNeoXForCausalLM": _GPT_NEOX,
    "FalconForCausalLM": _FALCON,
    "GPT2LMHeadModel": _GPT2,
}


def _splits() -> str:
    return f"it splits {', '.join(sorted(ARCHITECTURES))}, and a causal LM laid out as Llama whose twin check passes"


def architecture_of(model: nn.Module) -> Architecture:
    """The parts of ``model`` (a ``*ForCausalLM``, real or on meta): its family's declaration, or
    Llama's where its modules are named as Llama's (its rotary module taking the layer's attention
    type if its ``forward`` asks for one; to be checked by the twin), or a one-line ConfigError."""
    name = type(model).__name__
    if name in ARCHITECTURES:
        return ARCHITECTURES[name]
    modules = dict(model.named_modules())
    needed = [*LLAMA_LIKE.embeddings, LLAMA_LIKE.layers, *LLAMA_LIKE.final, LLAMA_LIKE.rotary]
    if all(part in modules for part in needed) and isinstance(modules[LLAMA_LIKE.layers], nn.ModuleList):
        rotary = inspect.signature(modules[LLAMA_LIKE.rotary].forward).parameters
        return replace(LLAMA_LIKE, rotary_by_layer_type=True) if "layer_type" in rotary else LLAMA_LIKE
    raise ConfigError(f"pipesched.hf cannot split {name}: {_splits()}")


def check_model_type(model_type: str) -> None:
    """Refuse (one line) a config's ``model_type`` transformers builds no causal LM for."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(f"pipesched.hf cannot split a {model_type!r} model (transformers has no causal LM for it): "
                          f"{_splits()}")


def causal_lm_class(config):
    """The ``*ForCausalLM`` class transformers builds for ``config`` (ConfigError if none)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        raise ConfigError(f"pipesched.hf cannot split a {type(config).__name__} model (no causal LM): {_splits()}") from None
