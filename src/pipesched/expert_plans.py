"""Which MoE layers expert parallelism splits, read from the model's config, and which routers
pipesched knows.

transformers declares where a family's routed experts are (``base_model_ep_plan``:
``"layers.*.mlp.experts": "ep_dispatch_experts"``, beside the experts' fused ``gate_up_proj``
``[E, 2I, H]`` and ``down_proj`` ``[E, H, I]``). pipesched splits those modules' experts over
``ep`` ranks and moves only their compute (:mod:`pipesched.runtime.sharding.expert_parallel`);
the router runs where it ran, so its choices are the one process's. That holds for a family
whose experts module takes ``(hidden_states, top_k_index, top_k_weights)`` and whose router's
choices depend on each token alone (no capacity, no token dropped): :data:`KNOWN_ROUTERS`, each
with what its router does.
Pure (no torch): the command line refuses an ``--ep`` before any rank starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .errors import ConfigError

EXPERTS_STYLE = "ep_dispatch_experts"  # transformers' ep-plan style of an experts module
KNOWN_ROUTERS = {  # *ForCausalLM class -> its router, as transformers computes it per token
    "MixtralForCausalLM": "softmax over every expert, top-k, renormalised (MixtralTopKRouter)",
    "Qwen2MoeForCausalLM": "softmax over every expert, top-k, renormalised with norm_topk_prob (Qwen2MoeTopKRouter)",
    "Qwen3MoeForCausalLM": "softmax over every expert, top-k, renormalised with norm_topk_prob (Qwen3MoeTopKRouter)",
    "DeepseekV3ForCausalLM": "sigmoid scores plus a correction bias, top groups then top-k, scaled by "
                             "routed_scaling_factor (DeepseekV3TopkRouter); shared experts stay dense",
}


@dataclass(frozen=True)
class ExpertPlan:
    """The experts modules to split (module-name tails below a decoder layer, ``"mlp.experts"``) and
    how many routed experts each holds."""

    modules: tuple[str, ...]
    experts: int

    def matches(self, name: str) -> bool:
        """Whether the module named ``name`` (in a stage: ``"3.mlp.experts"``) is one to split."""
        return any(name == tail or name.endswith("." + tail) for tail in self.modules)


def routed_experts(config: Any) -> Optional[int]:
    """The routed experts of each MoE layer of ``config`` (None: a dense model)."""
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        count = getattr(config, key, None)
        if isinstance(count, int) and count > 0:
            return count
    return None


def expert_plan_for(model_name: str, config: Any) -> Optional[ExpertPlan]:
    """The plan of the ``*ForCausalLM`` ``model_name`` with ``config``: None for a dense model or a
    family whose router pipesched does not know (:func:`check_ep` says which)."""
    declared = getattr(config, "base_model_ep_plan", None) or {}
    tails = tuple(key.split("*.", 1)[-1] for key, style in declared.items() if style == EXPERTS_STYLE)
    experts = routed_experts(config)
    if model_name not in KNOWN_ROUTERS or not tails or experts is None:
        return None
    return ExpertPlan(tails, experts)


def check_ep(model_name: str, config: Any, ep: int, data_ranks: int) -> None:
    """Refuse in one line an ``ep`` the model or layout cannot take: on a dense model, a family whose
    router pipesched does not know, ``ep`` not dividing the experts or the ``data_ranks``."""
    if ep == 1:
        return
    experts = routed_experts(config) if config is not None else None
    if experts is None:
        raise ConfigError(f"--ep {ep}: {model_name} is a dense model, it has no routed experts to split")
    if model_name not in KNOWN_ROUTERS or expert_plan_for(model_name, config) is None:
        raise ConfigError(f"--ep {ep}: {model_name}'s router is not one pipesched knows (expert parallelism runs "
                          f"{', '.join(sorted(KNOWN_ROUTERS))})")
    if experts % ep:
        raise ConfigError(f"--ep {ep} does not divide the {experts} routed experts of {model_name}")
    if data_ranks % ep:
        raise ConfigError(f"--ep {ep} does not divide the {data_ranks} data-parallel ranks (--dp x --dp-shard) "
                          "it borrows its ranks from")
