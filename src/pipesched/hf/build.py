"""Where a rank's blocks come from: a model built on every rank, or a config built on ``meta``.

Either way :class:`BlockSource` hands the runtime block ``i`` when it builds a stage, and a
storage-less copy of block ``i`` when it infers shapes on ``meta`` (so the modules it prepares
for the split backward are never the ones it runs on ``meta``).

- From a model: the model's own modules (no copy). After the runtime is built,
  :meth:`BlockSource.release_others` moves every module this rank does not own to ``meta``, so
  a rank holds only its stages' parameters.
- From a config: every block starts on ``meta``; a rank materialises only its own, initialised
  as the model's ``_init_weights`` initialises each module (block ``i`` after
  ``torch.manual_seed(seed + i)``, which the runtime sets; :func:`init_model` builds the whole
  model the same way, the single-process reference), then reads the weights by name from a
  folder of safetensors when one is given.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Optional, Union

import torch
from torch import nn

from ..errors import ConfigError
from .architectures import Architecture, architecture_of, causal_lm_class
from .blocks import model_blocks
from . import twin
from .disk_layout import DiskLayout
from .weights_index import index_weights, weight_files


def _on_meta() -> bool:
    return torch.get_default_device().type == "meta"


def meta_model(config) -> nn.Module:
    """The whole ``*ForCausalLM`` of ``config`` without storage."""
    with torch.device("meta"):
        return causal_lm_class(config)(config)


def initialise(model: nn.Module, module: nn.Module) -> None:
    """Give ``module`` (materialised, of ``model``) the model's own initial values, sub-modules first."""
    with torch.no_grad():
        for sub in reversed(list(module.modules())):
            model._init_weights(sub)


class BlockSource:
    """Block ``i`` of a Hugging Face causal LM, real or on ``meta``, as the runtime asks for it."""

    def __init__(self, model_or_config, weights: Optional[Union[str, Path]] = None,
                 weights_argument: str = "weights={!r}") -> None:
        from transformers import PretrainedConfig

        if isinstance(model_or_config, PretrainedConfig):
            self.config = model_or_config
            self.model = None
        else:
            self.model = model_or_config
            self.config = model_or_config.config
            architecture_of(model_or_config)  # the class given, not only the one its config builds
            if weights is not None:
                raise ConfigError("weights= reads a folder into a model built from a config; this model is built already")
        if getattr(self.config, "output_router_logits", False):
            raise ConfigError(
                "pipesched.hf trains MoE models without the router's auxiliary loss: its load-balancing loss is "
                "a product of sums over all layers and tokens, which no stage holds (set output_router_logits=False)"
            )
        self.skeleton = meta_model(self.config)
        if self.model is not None:  # the blocks' dtype is the model's (a double model: double boundaries)
            self.skeleton.to(next(self.model.parameters()).dtype)
        self.arch: Architecture = architecture_of(self.skeleton)
        twin.check(self.config, type(self.skeleton).__name__, self.arch)
        self._meta_blocks = model_blocks(self.skeleton, self.arch)
        self._real_blocks = model_blocks(self.model, self.arch) if self.model is not None else None
        self.weights = WeightsFolder(weights, self.skeleton, weights_argument) if weights is not None else None
        self.built: set[int] = set()

    @property
    def num_blocks(self) -> int:
        return len(self._meta_blocks)

    def meta_block(self, index: int) -> nn.Module:
        return self._meta_blocks[index]

    def __call__(self, index: int) -> nn.Module:
        if _on_meta():
            return self._meta_blocks[index]
        self.built.add(index)
        if self._real_blocks is not None:
            return self._real_blocks[index]
        block = copy.deepcopy(self._meta_blocks[index]).to_empty(device="cpu")
        initialise(self.skeleton, block)
        if self.weights is not None:
            self.weights.load_into(block)
        return block

    def release_others(self) -> None:
        """Move the model's modules outside this rank's blocks to ``meta`` (frees their memory)."""
        if self._real_blocks is None:
            return
        kept = {id(t) for i in self.built for t in [*self._real_blocks[i].parameters(), *self._real_blocks[i].buffers()]}
        for i, block in enumerate(self._real_blocks):
            if i not in self.built:
                for module in block.modules():
                    for name, param in list(module.named_parameters(recurse=False)):
                        if id(param) not in kept:
                            module.register_parameter(name, nn.Parameter(param.to("meta"), param.requires_grad))


def init_model(config, seed: int = 0) -> nn.Module:
    """The whole model of ``config`` initialised as the pipeline's ranks initialise their blocks
    from it (block ``i`` after ``torch.manual_seed(seed + i)``): the run to compare against."""
    model = copy.deepcopy(meta_model(config)).to_empty(device="cpu")
    for i, block in enumerate(model_blocks(model, architecture_of(model))):
        torch.manual_seed(seed + i)
        initialise(model, block)
    if config.tie_word_embeddings:
        model.tie_weights()
    return model


class WeightsFolder:
    """Tensors by the model's names from a folder of ``*.safetensors`` (with or without an index),
    in the layout transformers stores them (MoE experts one by one: :mod:`.disk_layout`)."""

    def __init__(self, folder: Union[str, Path], skeleton: nn.Module, argument: str = "weights={!r}") -> None:
        """``argument``: how the caller named the folder in errors (``--hf-weights {!r}`` for the CLI)."""
        self.folder = Path(folder)
        named = argument.format(str(folder))
        files = weight_files(self.folder)
        if not files:
            raise ConfigError(f"{named}: no *.safetensors files there")
        self.where, _ = index_weights(files, named)  # a key in two files or of no float dtype: refused
        self.layout = DiskLayout(skeleton, self.where)
        self.aliases = _tied_aliases(skeleton)
        for name, tensor in skeleton.state_dict().items():
            found = self._locate(name)
            if found is None:
                raise ConfigError(f"{named} does not match the config: it has no {name!r}")
            shape = tuple(self.layout.build(found, self._stored_meta).shape)
            if shape != tuple(tensor.shape):
                raise ConfigError(f"{named} does not match the config: {name!r} is "
                                  f"{list(shape)} there, {list(tensor.shape)} in the config's model")

    def _locate(self, name: str) -> Optional[str]:
        """The name (``name`` or its tied alias) the folder's layout builds a tensor for."""
        return next((key for key in (name, self.aliases.get(name)) if key is not None and key in self.layout), None)

    def _stored_meta(self, key: str) -> torch.Tensor:
        """A stored tensor's shape, on meta (nothing read; the shape is all a check needs)."""
        from safetensors import safe_open

        with safe_open(str(self.where[key]), framework="pt") as f:
            return torch.empty(f.get_slice(key).get_shape(), device="meta")

    def load_into(self, block: nn.Module) -> None:
        from contextlib import ExitStack

        from safetensors import safe_open

        with ExitStack() as files, torch.no_grad():
            opened: dict[Path, object] = {}

            def read(key: str) -> torch.Tensor:
                file = self.where[key]
                if file not in opened:
                    opened[file] = files.enter_context(safe_open(str(file), framework="pt"))
                return opened[file].get_tensor(key)

            for name, tensor in block.state_dict(keep_vars=True).items():
                tensor.copy_(self.layout.build(self._locate(name), read))


def _tied_aliases(model: nn.Module) -> dict[str, str]:
    """Tied names both ways (``lm_head.weight`` <-> ``transformer.wte.weight``): a saved model
    stores one of them."""
    tied = model.get_expanded_tied_weights_keys() if model.config.tie_word_embeddings else {}
    return {**tied, **{v: k for k, v in tied.items()}}
