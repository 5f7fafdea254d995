"""The one-way point-to-point latency between two ranks, measured before training: the
simulator's cost of a message when it replays the run's measured actions."""

from __future__ import annotations

import statistics
from time import perf_counter

import torch
import torch.distributed as dist


def measure_latency(shape: torch.Size, dtype: torch.dtype, device: torch.device, rounds: int = 20) -> float:
    """One-way p2p latency between ranks 0 and 1 (half the median round trip); 0 on one rank.
    On gloo the probe travels in host memory, as the runtime's messages do."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world < 2:
        return 0.0
    on_host = dist.get_backend() == "gloo"
    buf = torch.zeros(shape, dtype=dtype, device="cpu" if on_host else device)
    trips = []
    dist.barrier()
    for i in range(rounds + 3):
        t0 = perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        if i >= 3:
            trips.append(perf_counter() - t0)
    value = torch.tensor([statistics.median(trips) / 2 if rank == 0 else 0.0], dtype=torch.float64)
    dist.broadcast(value, 0)
    return float(value)
