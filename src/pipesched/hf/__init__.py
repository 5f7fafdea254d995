"""Hugging Face causal LMs trained by any pipesched schedule, equal to unpipelined training.

``pip install 'pipesched[hf]'`` (transformers and safetensors). See docs/huggingface.md.
"""

from __future__ import annotations

from .architectures import ARCHITECTURES
from .build import init_model
from .config_file import read_config
from .one_process import one_process_step
from .pipeline import HFPipeline, pipeline
from .saving import load_checkpoint, save_checkpoint, save_pretrained

__all__ = ["ARCHITECTURES", "HFPipeline", "init_model", "load_checkpoint", "one_process_step", "pipeline", "read_config",
           "save_checkpoint", "save_pretrained"]
