"""Tensor-parallel plans: what one is, and how it splits a stage.

A plan maps a module-name suffix (matched at dot boundaries, ``*`` standing for any one name:
``"layers.*.self_attn.q_proj"`` matches ``"1.model.layers.2.self_attn.q_proj"``, as transformers
writes its ``base_model_tp_plan``) to a style (:data:`~pipesched.sharded_bytes.TP_STYLES`, built
by :mod:`.tp_styles`), and ``"owner.attribute"`` to :data:`HEADS`: a head count (or width) the
module's forward reads, divided by ``tp`` once split. Which plan each model gets (transformers'
own, translated, and pipesched's overrides with their reasons) is :mod:`.model_plans`.

The styles follow Megatron's pairing: the projections that fan out (attention q/k/v, the MLP's
first layer or gate/up) split their output features, the ones that fan back in (attention output,
MLP down) their input features and all-reduce. Between them each rank computes its
``heads / tp`` heads and ``hidden / tp`` MLP columns; what enters and leaves a block is a plain
replicated tensor, so what crosses a stage boundary is unchanged. Norms (but the q/k norms
between the projections, :class:`~.tp_styles.HeadsNorm`), embeddings and the head stay replicated.

``gpt`` (the built-in model, :data:`GPT_PLAN`): ``attn.qkv`` holds each head's q, k and v rows
together (:class:`~pipesched.training.models.CausalSelfAttention`), so a column-wise split
hands each rank whole heads; ``attn.heads`` is divided by ``tp``.
"""

from __future__ import annotations

import copy
from typing import Iterator, Optional

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import parallelize_module

from ...errors import ConfigError
from ...sharded_bytes import FUSED_STYLES, ParamSpec, tp_dims
from ...expert_plans import ExpertPlan
from .tp_styles import is_transposed, style_for

Plan = dict[str, str]

HEADS = "heads"  # a plan entry "owner.attribute": HEADS names a head count that tp divides once split
GPT_PLAN: Plan = {"attn.qkv": "colwise", "attn.proj": "rowwise", "fc1": "colwise", "fc2": "rowwise", "attn.heads": HEADS}


def _matches(name: str, suffix: str) -> bool:
    """Whether module ``name`` ends with ``suffix``'s names (``*``: any one name)."""
    names, wanted = name.split("."), suffix.split(".")
    return len(names) >= len(wanted) and all(w in ("*", n) for w, n in zip(wanted, names[len(names) - len(wanted):]))


ATTENTION_NAMES = ("attn", "attention")  # a plan key with a name containing one of these is an attention's


def splits_attention(plan: Plan) -> bool:
    """Whether ``plan`` splits some module of an attention (a key with a name containing one of
    :data:`ATTENTION_NAMES`): only then does ``tp`` divide the model's heads. Falcon's multi-query
    layout and Phi-3 with fewer key-value heads keep the attention whole on every tp rank and split
    only the MLP, so their head counts need not divide."""
    return any(style != HEADS and any(word in name for name in key.split(".") for word in ATTENTION_NAMES)
               for key, style in plan.items())


def planned_modules(module: nn.Module, plan: Plan) -> Iterator[tuple[str, nn.Module, str]]:
    """(name, sub-module, style) of every sub-module of ``module`` the plan splits."""
    for name, sub in module.named_modules():
        for suffix, style in plan.items():
            if style != HEADS and _matches(name, suffix):
                yield name, sub, style


def param_specs(module: nn.Module, plan: Plan, experts: Optional[ExpertPlan] = None) -> list[ParamSpec]:
    """Every parameter of ``module`` once (tied ones once), with the dim ``plan`` splits and, under
    expert parallelism, which are the routed experts ``experts`` names: the input of
    :func:`~pipesched.sharded_bytes.rank_state_bytes`."""
    routed = {id(p) for name, sub in module.named_modules() if experts is not None and experts.matches(name)
              for p in sub.parameters()}
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
    return [ParamSpec(tuple(p.shape), split.get(id(p)), p.element_size(), fsdp.get(id(p), 0), id(p) in routed)
            for p in module.parameters()]


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
    one of an object (not a module) the module holds."""
    for suffix in (suffix for suffix, style in plan.items() if style == HEADS):
        owner, _, attr = suffix.rpartition(".")
        held_owner, _, held = owner.rpartition(".")
        for name, sub in module.named_modules():
            if _matches(name, owner) and hasattr(sub, attr):
                yield name, sub, "", attr
            elif held_owner and _matches(name, held_owner) and _shared_holder(getattr(sub, held, None), attr):
                yield name, sub, held, attr


def _shared_holder(held: object, attr: str) -> bool:
    """Whether ``held`` is an object other than a module (a module's counts are its own: matched
    by its name) that holds ``attr``."""
    return not isinstance(held, nn.Module) and hasattr(held, attr)
