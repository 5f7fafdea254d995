"""The twin check: a family's declaration verified against the model itself before it is split.

A declaration (:mod:`.architectures`) says which modules are the parts and what the model's
``forward`` does between them; a forgotten step (an embedding multiplier, a logit scale) would
train another model without a word. So before a model is split, a twin of its config (the
user's, with a few layers, small widths and a small vocabulary, every attention type and every
kind of layer it has kept: :func:`shrunken`) is built in float64 with random weights, and its
blocks run in order must give the model's own hidden states, logits and loss within
``TOLERANCE`` on a batch with a padded row (they are the model's modules on the same input:
only a missing or extra step, or a mask built otherwise, can move them, by far more). Else the
model is refused in one line naming the first part that differs. The check runs once per config and declaration in a process;
locally started ranks fork from the launcher (:mod:`pipesched.runtime.launching.rank_start`) and
inherit its passed checks, so a local run checks once (torchrun's ranks, and spawned ones, each check).
"""

from __future__ import annotations

import copy
from typing import Optional

import torch

from ..errors import ConfigError

TOLERANCE = 1e-6
_LAYERS = ("num_hidden_layers", "n_layer")
_SIZES = {"intermediate_size": 64, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16,
          "ffn_hidden_size": 64, "n_inner": 64, "kv_lora_rank": 16, "q_lora_rank": 16, "vocab_size": 128,
          "sliding_window": 4}
_AT_MOST = {"num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
            "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1}
_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")


def _layers_kept(config) -> int:
    """Enough layers for every attention type (the shortest prefix holding each) and for a
    dense-then-MoE model's both kinds; at least 2, at most the model's."""
    total = next(getattr(config, f) for f in _LAYERS if hasattr(config, f))
    types = list(getattr(config, "layer_types", None) or [])
    needed = max((types.index(t) + 1 for t in set(types)), default=1)
    return min(total, max(2, needed))


def shrunken(config, layers: Optional[int] = None):
    """The twin's config: ``config`` with few layers (``layers`` if given), small widths, a small
    vocabulary."""
    twin = copy.deepcopy(config)
    layers = layers or _layers_kept(config)
    for field in _LAYERS:
        if hasattr(twin, field):
            setattr(twin, field, layers)
    if getattr(twin, "layer_types", None):
        twin.layer_types = list(twin.layer_types[:layers])
    if getattr(twin, "mlp_only_layers", None):
        twin.mlp_only_layers = [i for i in twin.mlp_only_layers if i < layers]
    for field, size in _SIZES.items():
        if getattr(twin, field, None):
            setattr(twin, field, size)
    for field, most in _AT_MOST.items():
        if getattr(twin, field, None):
            setattr(twin, field, min(getattr(twin, field), most))
    _shrink_heads(twin)
    for field in _TOKEN_IDS:
        value = getattr(twin, field, None)
        if isinstance(value, int) and value >= twin.vocab_size:
            setattr(twin, field, None)
    twin._experts_implementation = "eager"  # grouped_mm takes no float64
    # eager unless the user's is sdpa (flash kernels need a GPU; the split is the same), and
    # weights large enough that a left-out logit soft-cap or scale moves the logits by far
    twin._attn_implementation = "sdpa" if getattr(config, "_attn_implementation", None) == "sdpa" else "eager"
    twin.initializer_range = 0.5
    return twin


def _shrink_heads(twin) -> None:
    """4 query heads (fewer where the model has fewer) of 16 dimensions (the model's where its
    rotary scaling lists a factor per dimension), key-value heads in the same relation (all, a
    group, or one); latent attention's ranks and head parts small; the width follows."""
    heads_field = "num_attention_heads" if hasattr(twin, "num_attention_heads") else "n_head"
    width_field = "hidden_size" if hasattr(twin, "hidden_size") else "n_embd"
    heads = getattr(twin, heads_field)
    head_dim = getattr(twin, "head_dim", None) or getattr(twin, width_field) // heads
    if not _rope_lists(twin):
        head_dim = min(head_dim, 16)
    kept = min(heads, 4)
    setattr(twin, heads_field, kept)
    setattr(twin, width_field, kept * head_dim)
    if vars(twin).get("head_dim"):
        twin.head_dim = head_dim
    for kv_field in ("num_key_value_heads", "num_kv_heads"):
        kv = vars(twin).get(kv_field)
        if kv:
            setattr(twin, kv_field, kept if kv == heads else 1 if kv == 1 else 2)
    if vars(twin).get("qk_rope_head_dim"):  # DeepSeek's latent attention: the rotary part is head_dim
        twin.qk_rope_head_dim = twin.head_dim = 8
        twin.qk_nope_head_dim, twin.v_head_dim = 8, 16
        if "qk_head_dim" in vars(twin):
            twin.qk_head_dim = 16


def _rope_lists(config) -> bool:
    """Whether the rotary scaling gives a factor per dimension (Phi-3's long rope): keep the dimensions."""
    found = [getattr(config, "rope_parameters", None), getattr(config, "rope_scaling", None)]
    while found:
        value = found.pop()
        if isinstance(value, dict):
            found.extend(value.values())
        elif isinstance(value, (list, tuple)):
            return True
    return False


def check(config, class_name: str, arch) -> None:
    """Refuse (one line) a model whose blocks, run in order on a twin of its config, are not the
    model: the first part that differs, by how much (or the error the blocks raised)."""
    key = (class_name, config.to_json_string(use_diff=False), id(arch))
    if key in _PASSED:
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only wait for each other (seconds on a busy machine)
    try:
        difference = _first_difference(shrunken(config), arch)
    except Exception as err:  # a config the shrinking or the model does not take: nothing verified
        difference = f"the twin cannot be built or run ({type(err).__name__}: {err})".splitlines()[0]
    finally:
        torch.set_num_threads(threads)
    if difference is not None:
        raise ConfigError(f"pipesched.hf cannot split {class_name} as declared: on a twin of its config "
                          f"(a few layers, small widths) {difference}")
    _PASSED.add(key)


_PASSED: set = set()  # (class, config, declaration) checked in this process


def _first_difference(twin, arch):
    from .architectures import causal_lm_class
    from .blocks import model_blocks
    from .loss import StepNormalisedLoss

    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        torch.manual_seed(0)
        model = causal_lm_class(twin)(twin).double().eval()
        ids = torch.randint(0, twin.vocab_size, (2, 8))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # a padded row: the masks the layers build must be the model's
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True)
        try:
            blocks = model_blocks(model, arch)
        except KeyError as err:
            return f"its parts are not where declared: the model has no module {err}"
        hidden, parts = ids, _part_names(len(blocks))
        try:
            for index, block in enumerate(blocks):
                hidden = block(hidden, {"attention_mask": mask})
                reference = want.hidden_states[index] if index < len(blocks) - 2 else None
                if index == len(blocks) - 1:
                    reference = want.logits
                if reference is not None and _apart(hidden, reference) > TOLERANCE:
                    return f"{_DIFFER} {parts[index]} ({_apart(hidden, reference):.1e} relative)"
        except Exception as err:  # a layer that needs what the declaration does not give it
            return f"{_DIFFER} {parts[index]} ({type(err).__name__}: {err})".splitlines()[0]
        loss = StepNormalisedLoss(twin.vocab_size, 1, 1)
        loss.start_step(labels)
        if _apart(loss(hidden, labels), want.loss) > TOLERANCE:
            return f"{_DIFFER} the loss"
    return None


_DIFFER = "its blocks in order differ from the model at"


def _part_names(count: int) -> list[str]:
    return ["the embeddings", *(f"decoder layer {i}" for i in range(count - 2)), "the head (norm, head, logit steps)"]


def _apart(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-300))
