"""The torch.distributed runtime: runs any validated Schedule, equal to unpipelined training.

The only layer of pipesched (with ``interop``) that imports torch.
"""

from .executor import NonFiniteLoss, PipelineRuntime, StepResult
from .launch import DistributedRunError, spawn
from .models import ModelDef, get_model
from .p2p import PeerFailure
from .partition import block_counts, sequential_builder, stage_block_ranges

__all__ = [
    "DistributedRunError",
    "ModelDef",
    "NonFiniteLoss",
    "PeerFailure",
    "PipelineRuntime",
    "StepResult",
    "block_counts",
    "get_model",
    "sequential_builder",
    "spawn",
    "stage_block_ranges",
]
