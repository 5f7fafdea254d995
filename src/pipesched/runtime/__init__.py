"""The torch.distributed runtime: runs any validated Schedule, equal to unpipelined training.

The only layer of pipesched (with ``interop``) that imports torch, and only where it runs
something: the names below load their module (and torch) on first use, so the pure-Python
parts (:mod:`.program`, each rank's program; :mod:`.timeline`, replaying measured times) import
anywhere, torch or not.
"""

from __future__ import annotations

from importlib import import_module

_HOME = {  # exported name -> the module that defines it
    "NonFiniteLoss": "executor",
    "balanced_block_counts": "stages.copies",
    "PipelineRuntime": "executor",
    "RuntimeOptions": "options",
    "StagedModel": "stages.staged_model",
    "StepResult": "metering.observers",
    "DistributedRunError": "launching.launch",
    "spawn": "launching.launch",
    "PeerFailure": "comm.p2p",
    "block_counts": "stages.partition",
    "sequential_builder": "stages.partition",
    "stage_block_ranges": "stages.partition",
}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value
