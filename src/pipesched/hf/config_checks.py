"""A Hugging Face ``config.json`` checked before any work: its sizes typed and ranged, the model it
asks for built small on ``meta``, the bytes of its weights predicted.

transformers trusts a config: a size given as a string, a float or NaN, heads that do not divide
the hidden size, a vocabulary of 0 or an unknown ``rope_type`` end in a ZeroDivisionError, a
KeyError or its own multi-line errors, some only when the model is built; ``num_hidden_layers``
of 10**9 builds for ever, and a 70-byte config may ask for tens of GB of weights. Here every
size field present is a whole number inside a range that holds every released model; the
model is built on ``meta`` with one and with two layers (whatever the config's own count), which
raises transformers' errors of building at once and, as every layer of a decoder has the same
parameters, gives the whole model's parameter count; the weights and their gradients (float32,
as pipesched builds them) must fit the memory there is (the machine's, or less under ``ulimit
-v`` or a cgroup limit). Each refusal is one ConfigError line.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from ..errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few KiB; a tokenizer's vocabulary does not belong in it
BYTES_PER_WEIGHT = 4  # float32: the blocks are built in torch's default dtype

# field -> (smallest, largest) accepted; the largest leave room above every released model
# (Llama 3.1 405B: 126 layers, hidden 16384, 128 heads; vocabularies up to 256k; MoE up to 384 experts)
SIZES: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 1024), "n_layer": (1, 1024),
    "hidden_size": (1, 1 << 16), "n_embd": (1, 1 << 16),
    "intermediate_size": (1, 1 << 20), "n_inner": (1, 1 << 20), "moe_intermediate_size": (1, 1 << 20),
    "num_attention_heads": (1, 1024), "n_head": (1, 1024), "num_key_value_heads": (1, 1024),
    "head_dim": (1, 4096),
    "vocab_size": (1, 1 << 24),
    "max_position_embeddings": (1, 1 << 24), "n_positions": (1, 1 << 24), "n_ctx": (1, 1 << 24),
    "sliding_window": (1, 1 << 24), "max_window_layers": (0, 1024),
    "num_local_experts": (1, 1024), "num_experts": (1, 1024), "num_experts_per_tok": (1, 1024),
}
OPTIONAL = {"n_inner", "head_dim", "sliding_window", "num_key_value_heads"}  # null: the model's default
# field -> the flag whose false says the field is unused: transformers then writes a window of 0
# into Qwen2-MoE's config (Qwen2MoeConfig: ``sliding_window if use_sliding_window else 0``)
UNUSED_WHEN_OFF = {"sliding_window": "use_sliding_window"}
LAYERS = ("num_hidden_layers", "n_layer")


def check_sizes(data: dict, where: str) -> None:
    """Refuse a size field of ``data`` (a config's JSON) that is not a whole number in range, or
    heads that do not divide what they split."""
    for field, (low, high) in SIZES.items():
        if field not in data or (data[field] is None and field in OPTIONAL):
            continue
        if field in UNUSED_WHEN_OFF and data.get(UNUSED_WHEN_OFF[field]) is False and data[field] == 0:
            continue
        value = data[field]
        if type(value) is not int:
            raise ConfigError(f"{where}: {field} must be a whole number from {low} to {high}, got {_shown(value)}")
        if not low <= value <= high:
            raise ConfigError(f"{where}: {field} must be from {low} to {high}, got {value}")
    hidden, heads = _first(data, "hidden_size", "n_embd"), _first(data, "num_attention_heads", "n_head")
    if hidden is not None and heads is not None and data.get("head_dim") is None and hidden % heads:
        raise ConfigError(f"{where}: the hidden size {hidden} does not split into {heads} attention heads")
    kv = data.get("num_key_value_heads")
    if heads is not None and kv is not None and heads % kv:
        raise ConfigError(f"{where}: {heads} attention heads do not split into {kv} key/value heads")
    experts = _first(data, "num_local_experts", "num_experts")
    chosen = data.get("num_experts_per_tok")
    if experts is not None and chosen is not None and chosen > experts:
        raise ConfigError(f"{where}: num_experts_per_tok {chosen} is more than the {experts} experts")


def _first(data: dict, *fields: str) -> Optional[int]:
    return next((data[f] for f in fields if data.get(f) is not None), None)


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def parameter_count(data: dict, layers: int, build) -> int:
    """The parameters of the model ``data`` asks for (``layers`` decoder layers), from builds of
    it on ``meta`` with one and two layers (``build(data)`` -> the model): every decoder layer
    of these families has the same parameters (exactly: checked against whole builds in
    tests/test_hf_hostile.py), except Qwen3-MoE's dense layers (``mlp_only_layers``,
    ``decoder_sparse_step``), counted here as expert layers, which hold more."""
    layers_key = next((k for k in LAYERS if k in data), "num_hidden_layers")
    small = {k: v for k, v in data.items() if k not in ("layer_types", "mlp_only_layers")}
    one, two = (_count(build({**small, layers_key: n})) for n in (1, 2))
    return one + (layers - 1) * (two - one)


def _count(model) -> int:
    seen, total = set(), 0
    for param in model.parameters():  # a tied weight once
        if id(param) not in seen:
            seen.add(id(param))
            total += param.numel()
    return total


def check_fits(parameters: int, where: str) -> None:
    """Refuse weights that, with their gradients, exceed the memory there is (locally spawned
    ranks share this machine's; under torchrun each rank holds about its share of the pipeline's)."""
    from ..environment import torchrun_rank

    have = memory_available()
    world = (torchrun_rank() or (0, 1, 0))[1]
    need = parameters * BYTES_PER_WEIGHT * 2 // world  # the weights and their gradients: a floor of a step's
    if have is not None and need > have:
        share = "" if world == 1 else f" (a share of {world} ranks)"
        raise ConfigError(f"{where}: its {parameters:,} parameters need {need / 2**30:.3g} GiB as float32 weights and "
                          f"gradients{share}, more than the {have / 2**30:.3g} GiB of memory there is")


def memory_available() -> Optional[int]:
    """The bytes this process may hold: the machine's memory, or less where an address-space
    limit (``ulimit -v``) or the container's cgroup says so; None where nothing says."""
    import resource

    from ..environment import physical_memory

    limits = [physical_memory()]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    limits.append(None if soft == resource.RLIM_INFINITY else soft)
    try:
        text = open("/sys/fs/cgroup/memory.max").read().strip()
        limits.append(int(text) if text.isdigit() else None)
    except OSError:
        pass
    known = [n for n in limits if n]
    return min(known) if known else None
