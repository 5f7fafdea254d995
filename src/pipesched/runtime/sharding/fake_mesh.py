"""A tensor-parallel mesh in one process, to run a parallelised stage on fake tensors before any
rank starts (the activations ``train --memory-limit`` predicts under ``--tp``:
:mod:`pipesched.runtime.engine.sizes_ahead`).

``parallelize_module`` needs a ``DeviceMesh``, and a mesh a process group. torch's fake process
group (backend ``"fake"``, ``torch.testing._internal.distributed.fake_pg``) has no peers and moves
no data: this process plays rank 0 of ``tp``. Under ``FakeTensorMode`` a DTensor's collectives
run on fake tensors, so a stage parallelised on this mesh computes the shapes, and autograd saves
the tensors, of the run's ``tp`` rank 0: every ``tp`` rank's, where ``tp`` divides the split dims
(torch gives rank 0 the larger piece where it does not). The group is this process's default
only inside the ``with``, and destroyed after it: the CLI then starts its ranks, or under torchrun
initialises its own group, as if it had never been.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh


@contextmanager
def fake_tp_mesh(tp: int) -> Iterator[DeviceMesh]:
    """A one-dimensional mesh of ``tp`` ranks on torch's fake process group, this process rank 0.
    Refused (RuntimeError) in a process that already has a process group: the fake one would
    replace it."""
    if dist.is_initialized():
        raise RuntimeError("a fake tensor-parallel mesh is made in a process without a process group")
    dist.init_process_group("fake", rank=0, world_size=tp)
    try:
        yield DeviceMesh("cpu", torch.arange(tp))
    finally:
        dist.destroy_process_group()
