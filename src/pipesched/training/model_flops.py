"""The model FLOPs of a token and a device's peak, for the model FLOPs utilization (MFU).

FLOPs per token (forward and backward) is the PaLM paper's estimate, which nanoGPT's
``estimate_mfu`` uses: ``6 N + 12 L d T``, ``N`` the model's parameters (a tied weight counted
once), ``L`` layers of width ``d`` attending over ``T`` tokens (the attention term for ``hf:``
models, from their config; the built-in models count ``6 N`` only). Recomputation is not counted
(model FLOPs, not hardware FLOPs).

A device's peak is ``--peak-tflops`` or, on CUDA, the dense bf16 peak of a few known devices
(vendor data sheets); elsewhere none, and the MFU is left out.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..runtime.stages.partition import meta_block

# dense bf16 tensor-core peak, TFLOP/s, by a substring of torch.cuda.get_device_name (SXM parts)
KNOWN_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 70.0}


def parameter_count(md) -> int:
    """The model's parameters, a tied group counted once (built on the meta device: no memory)."""
    sizes = {}
    for i in range(md.num_blocks):
        for name, p in meta_block(md.build_block, i).named_parameters():
            sizes[f"{i}.{name}"] = p.numel()
    shared = sum(sizes.get(name, 0) for group in md.tied for name in group[1:])
    return sum(sizes.values()) - shared


def flops_per_token(md, context: int) -> float:
    """``6 N + 12 L d T`` (see the module's docstring)."""
    flops = 6.0 * parameter_count(md)
    config = getattr(md.build_block, "config", None)
    layers, width = getattr(config, "num_hidden_layers", None), getattr(config, "hidden_size", None)
    if layers and width:
        flops += 12.0 * layers * width * context
    return flops


def peak_flops(device: torch.device, given_tflops: Optional[float]) -> Optional[float]:
    """FLOP/s of one device: ``given_tflops``, else the known peak of this CUDA device, else None."""
    if given_tflops is not None:
        return given_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((tflops * 1e12 for key, tflops in KNOWN_PEAK_TFLOPS.items() if key in name), None)
