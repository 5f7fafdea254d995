"""Fake-tensor shapes for the kernels whose fake implementation refuses what the CPU runs.

:mod:`.sizes_ahead` runs every stage on fake tensors to learn what autograd saves. Where torch's
fake (meta) implementation of a kernel checks more than its CPU kernel does, the fake run fails
on a model the ranks train without complaint. One such kernel matters today:

- ``aten._grouped_mm``, which transformers' mixture-of-experts layers run their experts with
  (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3): its meta implementation accepts bf16 inputs
  only, its CPU kernel fp32 too.

:class:`FakeKernels` answers such a call with the output the CPU kernel allocates: its shape
(torch's rule for the 2D/3D layouts) and its strides (the last dim padded to 16 bytes, as ATen's
``create_grouped_gemm_output_tensor`` pads it: a CPU rank holds and saves that span), in the
output dtype. It sits below autograd, which has already saved the call's own inputs, so what is
metered is what the CPU run holds: the runs' own figures to the byte for Mixtral, Qwen2-MoE,
Qwen3-MoE and DeepSeek-V3 (docs/layouts.md), Mixtral and Qwen3-MoE in the suite
(tests/test_hf_cli_checkpoints.py).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_ALIGN_BYTES = 16  # the CPU kernel pads its output's rows to this


def grouped_mm_output(a: torch.Tensor, b: torch.Tensor, offs: Optional[torch.Tensor],
                      out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    """An empty tensor shaped and strided as ``aten._grouped_mm``'s CPU kernel allocates its output."""
    if a.dim() == 2 and b.dim() == 2:
        size = [offs.size(0), a.size(0), b.size(1)]
    elif a.dim() == 2:
        size = [a.size(0), b.size(-1)]
    elif b.dim() == 2:
        size = [a.size(1), b.size(1)]
    else:
        size = [a.size(0), a.size(1), b.size(-1)]
    dtype = out_dtype or a.dtype
    align = _ALIGN_BYTES // dtype.itemsize
    padded = (size[-1] + align - 1) // align * align
    stride = [size[1] * padded, padded, 1] if len(size) == 3 else [padded, 1]
    return torch.empty_strided(size, stride, dtype=dtype, device=a.device)


class FakeKernels(TorchDispatchMode):
    """Inside ``FakeTensorMode``: ``_grouped_mm`` on inputs other than bf16 (which its fake kernel
    refuses) is answered by :func:`grouped_mm_output`; every other call passes."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._grouped_mm.default and args[0].dtype != torch.bfloat16:
            named = dict(zip(("offs", "bias", "out_dtype"), args[2:]), **kwargs)
            return grouped_mm_output(args[0], args[1], named.get("offs"), named.get("out_dtype"))
        return func(*args, **kwargs)
