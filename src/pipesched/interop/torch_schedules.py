"""torch.distributed.pipelining's own schedules as pipesched Schedules (needs torch).

torch's schedule classes build their per-rank ``pipeline_order`` in the constructor; stages can
be mocked, so no process group is needed (torch's own visualiser does the same). We convert the
order into a :class:`~pipesched.Schedule` to simulate it under our cost model and compare.
"""

from __future__ import annotations

import warnings
from typing import Optional
from unittest import mock

from ..actions import Action, Overlap
from ..ops import Op
from ..registry import TorchCounterpart, families
from ..schedule import Schedule

def torch_counterparts() -> dict[str, TorchCounterpart]:
    """pipesched name -> torch's schedule class, as each registered family declares it."""
    return {f.name: f.torch for f in families() if f.torch is not None}


def torch_schedule(name: str, ranks: int, microbatches: int, chunks: int = 2) -> Optional[Schedule]:
    """torch's counterpart of pipesched schedule ``name``, or None where torch refuses the case.

    DualPipeV's overlapped forward and backward stay one :class:`~pipesched.actions.Overlap`;
    actions that compute nothing (REDUCE_GRAD) are dropped.
    """
    import torch.distributed.pipelining.schedules as ts
    from torch.distributed.pipelining.stage import PipelineStage

    counterpart = torch_counterparts()[name]
    per_rank = counterpart.chunks or chunks
    class_name = counterpart.class_name
    cls = getattr(ts, class_name)
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank = 0
    stage.group_size = ranks
    stage.submod = None
    stage.num_stages = per_rank * ranks
    stages = stage if issubclass(cls, ts.PipelineScheduleSingle) else [stage] * per_rank
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            instance = cls(stages, microbatches)
    except (ValueError, AssertionError, RuntimeError):
        return None
    orders = []
    for rank in range(ranks):
        row = []
        for action in instance.pipeline_order[rank]:
            if action is None:
                row.append(None)
                continue
            if action.sub_actions is not None:
                row.append(Overlap(*(_plain(sub) for sub in action.sub_actions)))
            elif Op(action.computation_type.value).is_compute:
                row.append(_plain(action))
            # else: bookkeeping such as REDUCE_GRAD (torch >= 2.9 single-stage schedules)
        orders.append(row)
    return Schedule.from_orders(orders, name=f"torch:{class_name}")


def _plain(action) -> Action:
    return Action(action.stage_index, action.computation_type.value, action.microbatch_index)
