"""Hugging Face causal LMs trained by any pipesched schedule, equal to unpipelined training.

``pip install 'pipesched[hf]'`` (transformers and safetensors). See docs/huggingface.md.
"""

from __future__ import annotations

from importlib import import_module

_HOME = {  # exported name -> the module that defines it
    "ARCHITECTURES": "architectures",
    "HFPipeline": "pipeline",
    "init_model": "build",
    "pipeline": "pipeline",
    "read_config": "build",
    "load_checkpoint": "saving",
    "save_checkpoint": "saving",
    "save_pretrained": "saving",
}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value
