"""Reading a model's ``config.json`` as untrusted input: bounded, checked, one line when refused.

The file is read only if it is a regular file of at most :data:`~.config_checks.MAX_CONFIG_BYTES`
(a FIFO or ``/dev/zero`` named as a config cannot hang or fill memory); its JSON nested beyond
the parser's depth, a ``model_type`` that is not a splittable family's name, a size out of range
(:func:`~.config_checks.check_sizes`), any error transformers raises making the config or
building its model on ``meta``, and weights beyond the machine's memory are each one ConfigError
line. transformers' warnings (one per process, tens of lines) stay out of the terminal unless
``PIPESCHED_VERBOSE=1``.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Union

from ..errors import ConfigError
from .architectures import check_model_type
from .config_checks import MAX_CONFIG_BYTES, check_fits, check_sizes, parameter_count


def quiet_transformers() -> None:
    """Keep transformers' warnings and notes out of the terminal (``PIPESCHED_VERBOSE=1``: shown)."""
    if os.environ.get("PIPESCHED_VERBOSE", "") not in ("", "0"):
        return
    import warnings

    from transformers.utils import logging

    logging.set_verbosity_error()
    warnings.filterwarnings("ignore", module=r"transformers(\.|$)")


def model_folder(spec: Union[str, Path]) -> Path:
    """The folder of ``hf:SPEC``: ``SPEC`` itself when it is a folder (its config, tokenizer and
    weights together), else the folder of the config file it names."""
    path = Path(spec)
    return path if path.is_dir() else path.parent


def read_config(path: Union[str, Path]):
    """A transformers config from a ``config.json`` file (or a folder holding one), checked;
    ConfigError (one line) when it cannot be read, split or held."""
    from transformers import AutoConfig

    quiet_transformers()
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    where = f"the model config {str(file)!r}"
    data = _json(file, where)
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(f"{str(file)!r} is not a transformers config (no model_type)")
    if not isinstance(data["model_type"], str):
        raise ConfigError(f"{where}: model_type must be a name such as \"llama\", got {type(data['model_type']).__name__}")
    check_model_type(data["model_type"])
    check_sizes(data, where)
    try:
        config = AutoConfig.for_model(**data)
        count = parameter_count(data, config.num_hidden_layers, lambda d: _meta_model(AutoConfig.for_model(**d)))
    except ConfigError:
        raise
    except Exception as err:  # transformers' own checks: strict fields, rope parameters, ...
        words = " ".join(str(err).split())
        words = words if len(words) <= 300 else words[:297] + "..."
        raise ConfigError(f"cannot use {where}: {type(err).__name__}: {words}") from None
    check_fits(count, where)
    return config


def _meta_model(config):
    from .build import meta_model

    return meta_model(config)


def _json(file: Path, where: str):
    try:
        info = os.stat(file)
    except FileNotFoundError:
        raise ConfigError(f"no model config at {str(file)!r}") from None
    except OSError as err:
        raise ConfigError(f"cannot read {where}: {err.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"cannot read {where}: it is not a regular file")
    if info.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"cannot read {where}: {info.st_size} bytes, more than a config's {MAX_CONFIG_BYTES}")
    try:
        return json.loads(file.read_bytes()[:MAX_CONFIG_BYTES + 1])
    except RecursionError:
        raise ConfigError(f"cannot read {where}: its JSON is nested too deep") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read {where}: {getattr(err, 'strerror', None) or err}") from None
