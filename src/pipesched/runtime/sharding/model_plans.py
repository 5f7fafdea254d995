"""Which tensor-parallel plan (:mod:`.tp_plans`) each model gets: transformers' own, read from the
model's config, and one table of what pipesched does differently, each with its reason.

A Hugging Face config declares its family's plan (``base_model_tp_plan``: module names from the
base model down, ``"layers.*.self_attn.q_proj": "colwise"``; a ``config.json`` may carry its own).
The names match pipesched's blocks as they are (a block keeps the model's module names), and
transformers' ``"colwise"`` and ``"rowwise"`` are pipesched's styles of the same names (input
replicated, output features split; input features split, output all-reduced: torch's
``ColwiseParallel`` / ``RowwiseParallel`` as transformers registers them). Its other styles
(``colwise_gather_output``, ``replicated_with_grad_allreduce``, ``mla_kv_a_proj``,
``embedding_rowwise``, ``sequence_parallel``, ``packed_*``, ``local_*``, ...) have no pipesched
twin: a model whose plan keeps one that no override below replaces has no plan (``--tp`` refused
in one line). So a causal LM pipesched splits as Llama (:mod:`pipesched.hf.architectures`) whose
config declares a Llama-shaped plan trains under ``--tp`` with no entry here (Helium, for one);
one whose plan leaves a replicated parameter between its split projections is stopped on the
first step by :mod:`.tp_guard`.

:data:`OVERRIDES` holds, per ``*ForCausalLM`` class, the entries that replace or add to
transformers' plan (:data:`WHOLE`: a module transformers splits that pipesched keeps whole), each
group with its kind of reason (:class:`Why`, which tests/test_hf_tp_plans.py checks against
transformers' plan) and its family's own. Every other family's plan is transformers', unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Optional

from .tp_plans import GPT_PLAN, HEADS, Plan

TRANSLATED = frozenset({"colwise", "rowwise"})  # transformers' styles that are pipesched's of the same name
WHOLE = "whole"  # an override's style: the module stays whole on every tp rank


class Why(Enum):
    """The kinds of reasons an override has (each checked against transformers' plan by the tests)."""

    UNDECLARED = "transformers declares no plan for the family"
    SPLIT_FOR_REAL = ("transformers gathers the projections' outputs (every tp rank computes the whole attention or "
                      "MLP); pipesched splits them, each rank its own heads or columns")
    OWN_STYLE = "transformers' style has no pipesched twin; pipesched's own style does its work"
    ADDED = "transformers' plan leaves modules whole that pipesched splits"
    KEPT_WHOLE = "transformers splits modules that pipesched keeps whole on every tp rank"


@dataclass(frozen=True)
class Override:
    """Plan entries replacing or adding to transformers' for the configs ``when`` accepts (None: every one)."""

    why: Why
    reason: str
    entries: Plan
    when: Optional[Callable[[Any], bool]] = None


def _equal_heads(config: Any) -> bool:
    """Phi-3's q, k and v of equal widths: an interleaved placement gives each rank a slice of each."""
    return config.num_key_value_heads == config.num_attention_heads


def _falcon_heads_split(config: Any) -> bool:
    """Whether Falcon's attention splits by heads: its fused rows grouped by key-value head, and
    rotary positions (ALiBi's slopes are built for every head, outside the attention)."""
    grouped = getattr(config, "new_decoder_architecture", False) or not getattr(config, "multi_query", True)
    return grouped and not getattr(config, "alibi", True)


def _qk_norms(style: str) -> Plan:
    return {"layers.*.self_attn.q_norm": style, "layers.*.self_attn.k_norm": style}


_HEAD_NORMS = ("its q/k norms (one head's width, one weight for every head) sit between the split projections: "
               "transformers' replicated_with_grad_allreduce; pipesched runs them on DTensors of this rank's heads "
               "(tp_styles.HeadsNorm), which must know the heads' dim")
_PHI3_MLP = Override(Why.SPLIT_FOR_REAL, "gate|up fused one after the other: each rank the same slice of both "
                     "(colwise_fused2), so its forward's chunk finds its columns' gate and up",
                     {"layers.*.mlp.gate_up_proj": "colwise_fused2", "layers.*.mlp.down_proj": "rowwise"})
_FALCON_MLP = Override(Why.UNDECLARED, "its MLP as Megatron's; Falcon adds its attention's output into the MLP's in "
                       "place, so the row-wise output is a tensor of its own (rowwise_owned)",
                       {"h.*.mlp.dense_h_to_4h": "colwise", "h.*.mlp.dense_4h_to_h": "rowwise_owned"})

OVERRIDES: dict[str, tuple[Override, ...]] = {
    "Qwen2MoeForCausalLM": (Override(
        Why.ADDED, "its shared expert is an MLP, split as Llama's; the router, the routed experts and "
        "shared_expert_gate (one output on the whole input) stay whole, so every tp rank routes alike",
        {"layers.*.mlp.shared_expert.gate_proj": "colwise", "layers.*.mlp.shared_expert.up_proj": "colwise",
         "layers.*.mlp.shared_expert.down_proj": "rowwise"}),),
    "DeepseekV3ForCausalLM": (Override(
        Why.OWN_STYLE, "kv_a_proj_with_mqa hands every head one rotary key past the split kv_b_proj: transformers' "
        "mla_kv_a_proj; pipesched keeps the projection whole and sums the key's gradient over tp on the attention, "
        "which knows kv_lora_rank (rope_key, tp_styles.SharedRopeKey)",
        {"layers.*.self_attn.kv_a_proj_with_mqa": WHOLE, "layers.*.self_attn": "rope_key"}),),
    "Qwen3ForCausalLM": (Override(Why.OWN_STYLE, _HEAD_NORMS + " (dim 2 of (batch, seq, heads, head_dim))",
                                  _qk_norms("head_norm")),),
    "Qwen3MoeForCausalLM": (Override(Why.OWN_STYLE, _HEAD_NORMS + " (dim 2 of (batch, seq, heads, head_dim))",
                                     _qk_norms("head_norm")),),
    "Gemma3ForCausalLM": (Override(Why.OWN_STYLE, _HEAD_NORMS + " (dim 1: after the transpose to (batch, heads, "
                                   "seq, head_dim))", _qk_norms("head_norm_heads_first")),),
    "CohereForCausalLM": (Override(
        Why.ADDED, "with use_qk_norm its LayerNorms' (heads, head_dim) weights sit between the split projections, "
        "left plain by transformers' plan (a partial gradient): split with the heads",
        _qk_norms("split_norm"), when=lambda config: bool(getattr(config, "use_qk_norm", False))),),
    "Olmo2ForCausalLM": (Override(
        Why.SPLIT_FOR_REAL, "its q/k RMSNorms span the whole projections: transformers gathers q, k and v; "
        "pipesched splits the weights (heads x head_dim) with the channels and DTensor all-reduces the mean of squares",
        {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
         "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise", **_qk_norms("split_norm")}),),
    "Phi3ForCausalLM": (_PHI3_MLP, Override(
        Why.SPLIT_FOR_REAL, "q|k|v fused one after the other: each rank the same slice of each (colwise_fused3); "
        "its forward reads the heads from the config every layer shares: each attention's own copy, divided",
        {"layers.*.self_attn.qkv_proj": "colwise_fused3", "layers.*.self_attn.o_proj": "rowwise",
         "layers.*.self_attn.num_key_value_heads": HEADS, "layers.*.self_attn.config.num_attention_heads": HEADS},
        when=_equal_heads), Override(
        Why.KEPT_WHOLE, "fewer key-value than query heads: q, k and v of unequal widths, which no interleaved "
        "placement splits; the attention whole on every tp rank", {"layers.*.self_attn.qkv_proj": WHOLE,
                                                                    "layers.*.self_attn.o_proj": WHOLE},
        when=lambda config: not _equal_heads(config))),
    "GPT2LMHeadModel": (Override(
        Why.UNDECLARED, "Conv1D weights stored (in, out) (tp_styles' transposed styles); c_attn fuses all q, then "
        "all k, then all v (colwise_fused3), its forward splits them by split_size: num_heads and split_size divided",
        {"h.*.mlp.c_fc": "colwise", "h.*.mlp.c_proj": "rowwise", "h.*.attn.c_attn": "colwise_fused3",
         "h.*.attn.c_proj": "rowwise", "h.*.attn.num_heads": HEADS, "h.*.attn.split_size": HEADS}),),
    "FalconForCausalLM": (_FALCON_MLP, Override(
        Why.UNDECLARED, "grouped (40B, 180B) or per-head (RW) fused rows with rotary positions: a column-wise split "
        "hands each rank whole key-value groups (the multi-query layout and ALiBi keep the attention whole)",
        {"h.*.self_attention.query_key_value": "colwise", "h.*.self_attention.dense": "rowwise",
         "h.*.self_attention.num_heads": HEADS, "h.*.self_attention.num_kv_heads": HEADS}, when=_falcon_heads_split)),
    "GPTNeoXForCausalLM": (Override(
        Why.KEPT_WHOLE, "embeddings, norms and the head stay whole on every tp rank (pipesched has no embedding "
        "style: transformers' embedding_rowwise)", {"embed_in": WHOLE}),),
}


def declared_plan(config: Any) -> Plan:
    """transformers' plan for ``config``'s family (``base_model_tp_plan``; empty where it declares none)."""
    return dict(getattr(config, "base_model_tp_plan", None) or {})


def overrides_for(model_name: str, config: Any) -> list[Override]:
    """The overrides of :data:`OVERRIDES` that apply to ``model_name`` with ``config``."""
    return [o for o in OVERRIDES.get(model_name, ()) if o.when is None or o.when(config)]


def untranslated(model_name: str, config: Any) -> Plan:
    """transformers' entries for ``config`` that pipesched cannot apply and no override replaces."""
    replaced = {key for o in overrides_for(model_name, config) for key in o.entries}
    declared = declared_plan(config).items()
    return {key: style for key, style in declared if style not in TRANSLATED and key not in replaced}


def plan_for(model_name: str, config: Any = None) -> Optional[Plan]:
    """The plan of ``"gpt"``, or of a Hugging Face ``*ForCausalLM`` class name and its ``config``:
    transformers' with :data:`OVERRIDES` applied; None where none is declared, or where it keeps a
    style pipesched cannot apply (:func:`untranslated`)."""
    if model_name == "gpt":
        return GPT_PLAN
    plan = {**declared_plan(config), **{k: v for o in overrides_for(model_name, config) for k, v in o.entries.items()}}
    if not plan or untranslated(model_name, config):
        return None
    return {key: style for key, style in plan.items() if style != WHOLE}
