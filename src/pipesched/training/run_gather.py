"""What rank 0 brings back of every rank after a run: its memory (activations measured against
the prediction, parameters, gradients and optimizer state measured against the layout's
prediction) and its timelines, for one pipeline (replicas, shards and tensor-parallel ranks of
a stage hold the same figures, or their own equal shares).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist

from ..runtime.executor import PipelineRuntime
from ..runtime.metering.timeline import Timeline


@dataclass(frozen=True)
class RankMemory:
    """One rank's activation bytes: the most measured in any metered step against the prediction from
    the sizes measured on the first step; on CUDA the device's peak and the step-start baseline."""

    rank: int
    measured_peak_activation_bytes: int
    predicted_peak_activation_bytes: float
    device_peak_bytes: Optional[int] = None
    device_baseline_bytes: Optional[int] = None
    # parameters, gradients, optimizer state: {"measured": {...}, "predicted": {...}} (PipelineRuntime.state_bytes)
    state_bytes: Optional[dict] = None

    def summary(self) -> dict:
        """The JSON summary's entry (stable names; the device's only on CUDA)."""
        out = {"rank": self.rank, "measured_peak_activation_bytes": self.measured_peak_activation_bytes,
               "predicted_peak_activation_bytes": self.predicted_peak_activation_bytes}
        if self.device_peak_bytes is not None:
            out["device_peak_bytes"] = self.device_peak_bytes
            out["device_baseline_bytes"] = self.device_baseline_bytes
        if self.state_bytes is not None:
            out["measured_state_bytes"] = self.state_bytes["measured"]
            out["predicted_state_bytes"] = self.state_bytes["predicted"]
        return out



def gather_memory(runtime: PipelineRuntime, results: list, pipeline: tuple[int, ...]) -> tuple[list[RankMemory], list, dict]:
    """Every rank's :class:`RankMemory`, per-step activation curves and measured stage sizes, on
    rank 0, for one pipeline (its global ranks in pipeline order; replicas hold the same)."""
    device = [r.device_peak_bytes for r in results if r.device_peak_bytes is not None]
    baseline = [r.device_baseline_bytes for r in results if r.device_baseline_bytes is not None]
    mine = RankMemory(
        runtime.rank, max((r.peak_activation_bytes for r in results if r.peak_activation_bytes is not None), default=0),
        runtime.predicted_peak_activation_bytes(),
        max(device) if device else None, max(baseline) if baseline else None, runtime.state_bytes(),
    )
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object((mine, [r.activation_curve for r in results], runtime.measured_stage_memory()), parts, dst=0)
    if parts is None:
        return [], [], {}
    parts = [parts[r] for r in pipeline]
    curves = [[parts[r][1][step] for r in range(len(parts))] for step in range(len(results))]
    return [p[0] for p in parts], curves, {s: v for p in parts for s, v in p[2].items()}


def gather_timelines(per_step: list, pipeline: tuple[int, ...]) -> list[Timeline]:
    """Every step's timeline of one pipeline (its global ranks in pipeline order), on rank 0."""
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(per_step, parts, dst=0)
    if parts is None:
        return []
    return [[parts[r][step] for r in pipeline] for step in range(len(per_step))]
