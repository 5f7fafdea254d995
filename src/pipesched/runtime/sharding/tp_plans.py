"""Tensor-parallel plans of the models pipesched splits, and the styles that apply them.

A plan maps a module-name suffix (matched at a dot boundary: ``"attn.qkv"`` matches
``"blocks.2.attn.qkv"``) to a style (:data:`~pipesched.sharded_bytes.TP_STYLES`, built by
:mod:`.tp_styles`), and ``"owner.attribute"`` to :data:`HEADS`: a head count (or width) the module's
forward reads, divided by ``tp`` once split. The styles follow Megatron's pairing: the projections that fan out (attention q/k/v, the MLP's first layer or
gate/up) split their output features, the ones that fan back in (attention output, MLP down)
their input features and all-reduce. Between them each rank computes its ``heads / tp`` heads and
``hidden / tp`` MLP columns; what enters and leaves a block is a plain replicated tensor, so what
crosses a stage boundary is unchanged. Norms (but the q/k norms between the projections, below),
embeddings and the head stay replicated.

- ``gpt`` (the built-in model): ``attn.qkv`` holds each head's q, k and v rows together
  (:class:`~pipesched.training.models.CausalSelfAttention`), so a column-wise split hands each rank
  whole heads; ``attn.heads`` is divided by ``tp``.
- Llama-likes (Llama, Mistral, Qwen2, Gemma, Gemma 2, Granite, StarCoder2, Mixtral: LLAMA_LIKE below): transformers' own plan; their attention reads the head
  count from the projections' width, so nothing else changes (``tp`` must divide the key-value heads).
- Qwen2-MoE: Llama's plan, plus its shared expert (``mlp.shared_expert``, an MLP) split the same
  way; the router, the routed experts and ``shared_expert_gate`` (one output, on the whole input,
  scaling the shared expert's all-reduced output) stay whole on every rank, as Mixtral's experts
  do: their inputs are whole, so are their gradients, and both ``tp`` ranks route alike.
- DeepSeek-V3 (multi-head latent attention): the low-rank ``q_a_proj`` / ``kv_a_proj_with_mqa``
  and their norms see the whole hidden state and stay whole; ``q_b_proj`` (or ``q_proj``) and
  ``kv_b_proj`` fan out to the heads column-wise (the attention reshapes with ``-1`` heads),
  ``o_proj`` row-wise; the dense layers' MLP and the MoE layers' ``shared_experts`` as Llama's
  MLP, router and routed experts whole. The rotary key that ``kv_a_proj_with_mqa`` hands every
  head directly would leave that weight's gradient partial (measured at tp 2: gradients 4.3e-4
  off, weights 4.7e-5 after 2 SGD steps): ``"rope_key"`` (:class:`~.tp_styles.SharedRopeKey`)
  sums it over ``tp``.
- Qwen3, Qwen3-MoE, Gemma 3, Cohere, OLMo 2 (QK_NORM_PLANS below): Llama's plan, and their q/k
  norms, which sit between the split projections, computed on DTensors
  (:class:`~.tp_styles.HeadsNorm`): each rank normalises its own heads (OLMo 2's mean over the
  whole projection all-reduced), and a weight shared by the heads has its gradient summed over ``tp``.
- GPT-2: the MLP (``c_fc`` / ``c_proj``, Conv1D: weights stored transposed), and its fused
  ``c_attn`` (all q, then all k, then all v) as Phi-3's below, ``num_heads`` and ``split_size``
  divided.
- GPT-NeoX: ``query_key_value``'s rows are laid out per head (each head's q, k, v together; the
  forward views them with ``-1`` heads), so a column-wise split hands each rank whole heads, as
  for the gpt; its parallel residual and partial rotary act per head or outside the pair.
- Falcon: with ``new_decoder_architecture`` (40B, 180B) the fused rows are grouped by key-value
  head (a group's queries, then its k and v), without it and without multi-query (RW) per head:
  a column-wise split hands each rank whole groups, and its ``num_heads`` and ``num_kv_heads`` are
  divided (``tp`` must divide the key-value heads). The multi-query layout (7B: all queries, then
  one k and one v) and ALiBi (slopes built for every head outside the attention) keep the
  attention whole on every ``tp`` rank and split only the MLP. Falcon adds the attention's output
  into the MLP's in place: its MLP's row-wise output is a tensor of its own (``rowwise_owned``).
- Phi-3 and GPT-2's attention fuse equal projections one after the other (q | k | v, gate | up;
  Phi-3's forward slices them with sizes from its config, GPT-2's ``split``-s by ``split_size``):
  ``colwise_fused3`` / ``colwise_fused2`` give each rank the same slice of every projection
  (``_StridedShard``), so the gathered weight keeps transformers' layout; FSDP2 shards those
  weights on their other dim (torch 2.13's cannot shard a ``_StridedShard`` dim again: GPT-2's
  ``c_attn`` bias, 1-D, trained 1.2e-2 off at dp_shard 2 x tp 2), and a fused bias stays whole on
  every ``tp`` rank. Phi-3
  reads its query heads from the config every layer shares: each attention gets its own copy,
  divided. Phi-3 with fewer key-value than query heads (q, k and v of unequal widths, which no
  interleaved placement splits) keeps its attention whole on every ``tp`` rank, as Falcon's
  multi-query layout does, and splits only its MLP. DCP cannot place an interleaved piece: checkpoints gather them along ``tp`` first
  (:mod:`~pipesched.runtime.checkpoints.checkpoint_strided`).
"""

from __future__ import annotations

import copy
from typing import Any, Iterator, Optional

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import parallelize_module

from ...errors import ConfigError
from ...sharded_bytes import FUSED_STYLES, ParamSpec, tp_dims
from .tp_styles import is_transposed, style_for

Plan = dict[str, str]

HEADS = "heads"  # a plan entry "owner.attribute": HEADS names a head count that tp divides once split
GPT_PLAN: Plan = {"attn.qkv": "colwise", "attn.proj": "rowwise", "fc1": "colwise", "fc2": "rowwise", "attn.heads": HEADS}
LLAMA_PLAN: Plan = {
    "self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise",
}
QWEN2_MOE_PLAN: Plan = {**LLAMA_PLAN, "mlp.shared_expert.gate_proj": "colwise", "mlp.shared_expert.up_proj": "colwise",
                        "mlp.shared_expert.down_proj": "rowwise"}
DEEPSEEK_V3_PLAN: Plan = {
    "self_attn.q_proj": "colwise", "self_attn.q_b_proj": "colwise", "self_attn.kv_b_proj": "colwise",
    "self_attn.o_proj": "rowwise", "self_attn": "rope_key", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise", "mlp.shared_experts.gate_proj": "colwise", "mlp.shared_experts.up_proj": "colwise",
    "mlp.shared_experts.down_proj": "rowwise",
}
GPT2_PLAN: Plan = {"mlp.c_fc": "colwise", "mlp.c_proj": "rowwise", "attn.c_attn": "colwise_fused3", "attn.c_proj": "rowwise",
                   "attn.num_heads": HEADS, "attn.split_size": HEADS}
NEOX_PLAN: Plan = {"attention.query_key_value": "colwise", "attention.dense": "rowwise",
                   "mlp.dense_h_to_4h": "colwise", "mlp.dense_4h_to_h": "rowwise"}
PHI3_MLP_PLAN: Plan = {"mlp.gate_up_proj": "colwise_fused2", "mlp.down_proj": "rowwise"}
PHI3_PLAN: Plan = {**PHI3_MLP_PLAN, "self_attn.qkv_proj": "colwise_fused3", "self_attn.o_proj": "rowwise",
                   "self_attn.num_key_value_heads": HEADS, "self_attn.config.num_attention_heads": HEADS}
FALCON_MLP_PLAN: Plan = {"mlp.dense_h_to_4h": "colwise", "mlp.dense_4h_to_h": "rowwise_owned"}
FALCON_PLAN: Plan = {**FALCON_MLP_PLAN, "self_attention.query_key_value": "colwise", "self_attention.dense": "rowwise",
                     "self_attention.num_heads": HEADS, "self_attention.num_kv_heads": HEADS}


# the Hugging Face classes LLAMA_PLAN fits: their attention and MLP carry exactly its module names
# and hold no parameter of their own between a column-wise projection and its row-wise partner.
# Those with q/k norms there have QK_NORM_PLANS below: under LLAMA_PLAN alone a plain replicated
# norm weight sees only its rank's heads and its gradient stays partial (measured: Qwen3's q_norm
# 1.2e-4 off after 3 SGD steps at tp 2); GPT-NeoX, Falcon and Phi-3 name and fuse theirs
# otherwise (plan_for). Each one exact at tp 2 (benchmarks/tp_families.py --check: Starcoder2's MLP and Mixtral's experts
# carry other names and stay whole).
LLAMA_LIKE = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM",
              "GraniteForCausalLM", "Starcoder2ForCausalLM", "MixtralForCausalLM")
OTHER_PLANS = {"Qwen2MoeForCausalLM": QWEN2_MOE_PLAN, "DeepseekV3ForCausalLM": DEEPSEEK_V3_PLAN}


def _with_qk_norms(style: str) -> Plan:
    """Llama's plan, the q/k norms between its projections in ``style`` (tp_styles.HeadsNorm)."""
    return {**LLAMA_PLAN, "self_attn.q_norm": style, "self_attn.k_norm": style}


# the Hugging Face classes with q/k norms between the split projections: Llama's plan (their other
# names are Llama's) and the norms on DTensors, so their weights' gradients are summed over tp
# (tp_styles.HeadsNorm; each exact at tp 2, benchmarks/tp_families.py --check):
# - Qwen3, Qwen3-MoE (experts whole, as Mixtral's): RMSNorm of one head's width on the
#   (batch, seq, heads, head_dim) view, one weight for every head: replicated;
# - Gemma 3: the same norms (weight 1 + w) after the transpose to (batch, heads, seq, head_dim);
# - Cohere: with use_qk_norm, LayerNorms over head_dim whose weight is (heads, head_dim): split with
#   the heads (without, the plan's norms match nothing and Llama's plan is what is left);
# - OLMo 2: RMSNorms over the whole q and k projections, (heads * head_dim) weights: split with
#   the channels, the mean of the squares over every head all-reduced by DTensor.
QK_NORM_PLANS: dict[str, Plan] = {
    "Qwen3ForCausalLM": _with_qk_norms("head_norm"), "Qwen3MoeForCausalLM": _with_qk_norms("head_norm"),
    "Gemma3ForCausalLM": _with_qk_norms("head_norm_heads_first"),
    "CohereForCausalLM": _with_qk_norms("split_norm"), "Olmo2ForCausalLM": _with_qk_norms("split_norm"),
}


# every Hugging Face class with a plan, by its name
HF_PLANS: dict[str, Plan] = {**dict.fromkeys(LLAMA_LIKE, LLAMA_PLAN), **OTHER_PLANS, **QK_NORM_PLANS}


def plan_for(model_name: str, config: Any = None) -> Optional[Plan]:
    """The plan of ``"gpt"``, or of a Hugging Face ``*ForCausalLM`` class name (and its ``config``:
    Falcon's plan depends on its layout); None for a model no plan is known to fit."""
    if model_name == "gpt":
        return GPT_PLAN
    if model_name == "GPT2LMHeadModel":
        return GPT2_PLAN
    if model_name == "GPTNeoXForCausalLM":
        return NEOX_PLAN
    if model_name == "Phi3ForCausalLM":  # q, k and v of equal widths: each rank holds a slice of each
        equal = config is not None and config.num_key_value_heads == config.num_attention_heads
        return PHI3_PLAN if equal else PHI3_MLP_PLAN  # fewer kv heads: no placement splits q|k|v, attention whole
    if model_name == "FalconForCausalLM":
        return FALCON_PLAN if _falcon_heads_split(config) else FALCON_MLP_PLAN
    return HF_PLANS.get(model_name)


def _falcon_heads_split(config: Any) -> bool:
    """Whether Falcon's attention splits by heads: its fused rows grouped by key-value head, and
    rotary positions (ALiBi's slopes are built for every head, outside the attention)."""
    grouped = getattr(config, "new_decoder_architecture", False) or not getattr(config, "multi_query", True)
    return grouped and not getattr(config, "alibi", True)


def _matches(name: str, suffix: str) -> bool:
    return name == suffix or name.endswith("." + suffix)


def planned_modules(module: nn.Module, plan: Plan) -> Iterator[tuple[str, nn.Module, str]]:
    """(name, sub-module, style) of every sub-module of ``module`` the plan splits."""
    for name, sub in module.named_modules():
        for suffix, style in plan.items():
            if style != HEADS and _matches(name, suffix):
                yield name, sub, style


def param_specs(module: nn.Module, plan: Plan) -> list[ParamSpec]:
    """Every parameter of ``module`` once (tied ones once), with the dim ``plan`` splits: the
    input of :func:`~pipesched.sharded_bytes.rank_state_bytes`."""
    split: dict[int, int] = {}
    fsdp: dict[int, int] = {}
    for _, sub, style in planned_modules(module, plan):
        weight_dim, bias_dim = tp_dims(style, is_transposed(sub))
        if weight_dim is None:  # a style that splits no weight of its module
            continue
        split[id(sub.weight)] = weight_dim
        fsdp[id(sub.weight)] = 1 - weight_dim if style in FUSED_STYLES else 0
        if getattr(sub, "bias", None) is not None and bias_dim is not None:
            split[id(sub.bias)] = bias_dim
    return [ParamSpec(tuple(p.shape), split.get(id(p)), p.element_size(), fsdp.get(id(p), 0)) for p in module.parameters()]


def apply_tp(module: nn.Module, plan: Plan, tp_mesh: DeviceMesh) -> int:
    """Split ``module``'s planned sub-modules over ``tp_mesh`` and divide its head counts by the
    mesh's size; returns how many sub-modules were split. A no-op at ``tp = 1``. (The layout is
    checked before any rank starts, :mod:`pipesched.layout_refusals`; a head count ``tp`` does
    not divide is refused here too, rather than computed wrong.)"""
    tp = tp_mesh.size()
    if tp == 1:
        return 0
    counts = list(_head_counts(module, plan))
    for name, sub, held, attr in counts:
        heads = getattr(getattr(sub, held) if held else sub, attr)
        if heads % tp:
            raise ConfigError(f"tensor parallelism tp={tp} does not divide the {heads} heads of {name}")
    styles = {name: style_for(style, sub) for name, sub, style in planned_modules(module, plan)}
    parallelize_module(module, tp_mesh, styles)
    for name, sub, held, attr in counts:
        if held:  # an object other modules share (Phi-3's config): this module's own copy
            setattr(sub, held, copy.copy(getattr(sub, held)))
        owner = getattr(sub, held) if held else sub
        setattr(owner, attr, getattr(owner, attr) // tp)
    return len(styles)


def _head_counts(module: nn.Module, plan: Plan) -> Iterator[tuple[str, nn.Module, str, str]]:
    """(module name, module, held object or "", attribute) of each head count the plan's HEADS
    entries name: ``"attn.heads"`` an attribute of a module, ``"self_attn.config.num_attention_heads"``
    one of an object the module holds."""
    for suffix in (suffix for suffix, style in plan.items() if style == HEADS):
        owner, _, attr = suffix.rpartition(".")
        held_owner, _, held = owner.rpartition(".")
        for name, sub in module.named_modules():
            if _matches(name, owner) and hasattr(sub, attr):
                yield name, sub, "", attr
            elif held_owner and _matches(name, held_owner) and hasattr(getattr(sub, held, None), attr):
                yield name, sub, held, attr
