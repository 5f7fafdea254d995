"""Which Hugging Face causal LMs pipesched can split, and where their parts live (module names).

A decoder splits into ``num_hidden_layers + 2`` blocks: the embeddings (token, and GPT-2's
learned positions and dropout), each decoder layer, and the final norm with the head. Only the
hidden state crosses from one block to the next: positions, masks and rotary tables are rebuilt
by every layer block from the batch (:mod:`.blocks`). An architecture is listed here only when
its base model's ``forward`` does nothing beyond those parts (no embedding scale, no logit
soft-capping), so that running the blocks one after the other computes what the model does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import ConfigError


@dataclass(frozen=True)
class Architecture:
    """The module names of one family of ``*ForCausalLM`` models."""

    embeddings: tuple[str, ...]  # run first, in this order (token embedding first)
    layers: str  # the ModuleList of decoder layers
    final: tuple[str, ...]  # the final norm, then the head
    rotary: Optional[str] = None  # the rotary embedding every layer block rebuilds its tables with
    learned_positions: Optional[str] = None  # an embedding of position ids added to the tokens'
    dropout: Optional[str] = None  # dropout after the embeddings

    @property
    def token_embedding(self) -> str:
        return self.embeddings[0]

    @property
    def head(self) -> str:
        return self.final[-1]


_LLAMA_LIKE = Architecture(("model.embed_tokens",), "model.layers", ("model.norm", "lm_head"), rotary="model.rotary_emb")
_GPT2 = Architecture(
    ("transformer.wte", "transformer.wpe", "transformer.drop"), "transformer.h", ("transformer.ln_f", "lm_head"),
    learned_positions="transformer.wpe", dropout="transformer.drop",
)

MODEL_TYPES = {  # a config's model_type -> the causal LM transformers builds for it
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}

ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": _LLAMA_LIKE,
    "MistralForCausalLM": _LLAMA_LIKE,
    "MixtralForCausalLM": _LLAMA_LIKE,
    "Qwen2ForCausalLM": _LLAMA_LIKE,
    "Qwen3ForCausalLM": _LLAMA_LIKE,
    "Qwen3MoeForCausalLM": _LLAMA_LIKE,
    "GPT2LMHeadModel": _GPT2,
}


def architecture_of(class_name: str) -> Architecture:
    """The parts of a ``*ForCausalLM`` class, or a one-line ConfigError naming those it can split."""
    try:
        return ARCHITECTURES[class_name]
    except KeyError:
        raise ConfigError(
            f"pipesched.hf cannot split {class_name}: it splits {', '.join(sorted(ARCHITECTURES))}"
        ) from None


def check_model_type(model_type: str) -> None:
    """Refuse (one line) a config's ``model_type`` none of the splittable architectures has."""
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"pipesched.hf cannot split a {model_type!r} model: it splits "
                          f"{', '.join(sorted(ARCHITECTURES))}")


def causal_lm_class(config):
    """The ``*ForCausalLM`` class transformers builds for ``config`` (ConfigError if none or unsupported)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        raise ConfigError(
            f"pipesched.hf cannot split a {type(config).__name__} model (no causal LM): it splits "
            f"{', '.join(sorted(ARCHITECTURES))}"
        ) from None
    architecture_of(cls.__name__)
    return cls
