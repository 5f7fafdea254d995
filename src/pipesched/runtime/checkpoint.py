"""Checkpoints with torch.distributed.checkpoint (DCP): sharded per rank, loadable into any layout.

A checkpoint is a folder ``DIR/step-000012`` in DCP's format (one file per rank and DCP's
``.metadata``). Every rank writes what it owns, keyed by the unpipelined model's names
(``"3.fc1.weight"``):

- ``model.<name>``: the parameters and buffers of its blocks;
- ``optim.state.<name>.<key>`` and ``optim.param_groups.<name>.<key>``: its optimizer's state and
  settings per parameter (``torch.distributed.checkpoint.state_dict`` with
  ``flatten_optimizer_state_dict``, made for pipelines: no per-rank parameter indices);
- ``rng.<rank>.cpu`` (and ``.cuda``): its random generators.

The step counter is the folder's name; the data position is the step (pipesched's batches are a
function of the seed and the step). Because nothing is keyed by stage or rank, a checkpoint loads
under another schedule or rank count: each rank asks DCP for the entries of the blocks it owns
(random generators are restored only on the same rank count, where they mean the same thing).

A checkpoint is complete or absent: DCP writes into ``DIR/.step-000012.partial`` and the folder
is renamed to its final name (atomic) after every rank's data and the metadata are on disk, so a
crash while saving leaves the previous checkpoint the newest complete one.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError

PathLike = Union[str, Path]
STEP_DIR = re.compile(r"^step-(\d+)$")
PARTIAL = ".partial"
DEFAULT_KEEP = 2


def _dcp():
    """torch.distributed.checkpoint, imported on first use: it adds over a second of imports to
    every process, which runs that never checkpoint should not pay."""
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.state_dict  # noqa: F401  (dcp.state_dict below)

    return dcp


@contextmanager
def _quiet_without_group():
    """DCP warns that it "assumes the intent" whenever no process group exists: one process
    (the reference run) is meant, so the warning only adds noise to its output."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _optim_options():
    """Optimizer state flattened per parameter name: no per-rank indices, so it reshards."""
    return _dcp().state_dict.StateDictOptions(flatten_optimizer_state_dict=True)


class CheckpointMismatch(ConfigError):
    """A checkpoint of another model (names or shapes differ) or another optimizer."""


# -- where checkpoints live ---------------------------------------------------------------------


def step_dir(directory: PathLike, step: int) -> Path:
    return Path(directory) / f"step-{step:06d}"


def checkpoint_step(path: PathLike) -> int:
    """The step a checkpoint folder was saved after (its name says it)."""
    match = STEP_DIR.match(Path(path).name)
    if not match:
        raise ConfigError(f"{str(path)!r} is not a checkpoint folder (step-NNNNNN)")
    return int(match.group(1))


def complete_checkpoints(directory: PathLike) -> list[Path]:
    """Every complete checkpoint in ``directory``, oldest first (partial writes are never listed)."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if STEP_DIR.match(p.name) and (p / ".metadata").is_file()]
    return sorted(found, key=checkpoint_step)


def latest(directory: PathLike) -> Optional[Path]:
    """The newest complete checkpoint in ``directory``, or None."""
    found = complete_checkpoints(directory)
    return found[-1] if found else None


def prepare_directory(directory: PathLike, resume: bool) -> Optional[Path]:
    """Check ``directory`` before a run starts (ConfigError: one line) and create it; return the
    checkpoint to resume from (with ``resume``), else None.

    Starting afresh in a folder that already holds checkpoints is refused: the new run's would
    mix with the old run's, and ``--resume`` would then pick from both."""
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--checkpoint-dir {str(folder)!r} is a file, not a folder")
    newest = latest(folder)
    if resume and newest is None:
        raise ConfigError(f"--resume: no complete checkpoint in {str(folder)!r} (step-NNNNNN folders)")
    if not resume and newest is not None:
        raise ConfigError(
            f"--checkpoint-dir {str(folder)!r} already holds checkpoints (newest {newest.name}): "
            "add --resume to continue that run, or choose an empty folder"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".pipesched-write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"--checkpoint-dir {str(folder)!r}: cannot write there ({err.strerror})") from None
    return newest


# -- what a checkpoint holds --------------------------------------------------------------------


def training_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """This process's share of the run's state, keyed by unpipelined names (what DCP saves, and
    the template it loads into: its tensors are the live ones)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    rng = {"cpu": torch.get_rng_state()}
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return {
        "model": model.state_dict(),
        "optim": _dcp().state_dict.get_optimizer_state_dict(model, optimizer, options=_optim_options()),
        "rng": {str(rank): rng},
    }


def model_shapes(build_block: Callable[[int], nn.Module], num_blocks: int) -> dict[str, torch.Size]:
    """Every state entry of the unpipelined model and its shape, without allocating it."""
    from .partition import meta_block

    return {
        f"{i}.{name}": t.shape for i in range(num_blocks) for name, t in meta_block(build_block, i).state_dict().items()
    }


def saved_entries(path: PathLike) -> Mapping:
    """DCP's index of a checkpoint: entry name -> metadata (tensors have ``.size``)."""
    return _dcp().FileSystemReader(str(path)).read_metadata().state_dict_metadata


def check_matches(path: PathLike, shapes: Mapping[str, Sequence[int]], optimizer_settings: Sequence[str],
                  whole_model: bool = True) -> None:
    """Raise CheckpointMismatch unless ``path`` holds this model (``shapes``: every entry, or with
    ``whole_model=False`` those of this rank) trained with an optimizer of these settings."""
    entries = saved_entries(path)
    saved = {k[len("model."):]: tuple(v.size) for k, v in entries.items() if k.startswith("model.")}
    where = str(path)
    for name, shape in shapes.items():
        if name not in saved:
            raise CheckpointMismatch(f"{where} is a checkpoint of another model: it has no {name!r}")
        if saved[name] != tuple(shape):
            raise CheckpointMismatch(
                f"{where} is a checkpoint of another model: {name!r} is {list(saved[name])} there, {list(shape)} here"
            )
    if whole_model and len(saved) != len(shapes):
        extra = next(n for n in saved if n not in shapes)
        raise CheckpointMismatch(f"{where} is a checkpoint of another model: it has {extra!r}, which this model lacks")
    settings: dict[str, list[str]] = {}
    for key in entries:
        if key.startswith("optim.param_groups."):
            name, setting = key[len("optim.param_groups."):].rsplit(".", 1)
            settings.setdefault(name, []).append(setting)
    name = next((n for n in shapes if n in settings), None)
    if name is not None and sorted(settings[name]) != sorted(optimizer_settings):
        raise CheckpointMismatch(
            f"{where} was saved with another optimizer (settings {', '.join(sorted(settings[name]))}; "
            f"this run's: {', '.join(sorted(optimizer_settings))})"
        )


def optimizer_settings(optimizer: torch.optim.Optimizer) -> list[str]:
    """The per-parameter settings a checkpoint stores for ``optimizer`` (lr, momentum, betas...)."""
    return [k for k in optimizer.param_groups[0] if k != "params"]


def saved_world(path: PathLike) -> int:
    """How many processes wrote a checkpoint (one random generator state each)."""
    return len({k.split(".")[1] for k in saved_entries(path) if k.startswith("rng.")})


# -- saving and loading -------------------------------------------------------------------------


def save(directory: PathLike, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
         keep: int = DEFAULT_KEEP) -> Path:
    """Save this process's share as ``directory/step-NNNNNN``, complete or not at all; keep the
    newest ``keep`` checkpoints. Collective: every rank of the process group calls it."""
    final = step_dir(directory, step)
    partial = final.with_name(f".{final.name}{PARTIAL}")
    coordinator = not dist.is_initialized() or dist.get_rank() == 0
    if coordinator:
        shutil.rmtree(partial, ignore_errors=True)  # left by a crash at this step
    _barrier()
    with _quiet_without_group():
        _dcp().save(training_state(model, optimizer), checkpoint_id=str(partial), no_dist=not dist.is_initialized())
    if coordinator:  # DCP returns once every rank's data and the metadata are written and synced
        if final.exists():
            shutil.rmtree(final)
        os.rename(partial, final)
        _sync_folder(final.parent)
        for old in complete_checkpoints(directory)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def load(path: PathLike, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load what this process owns from checkpoint ``path`` into ``model`` and ``optimizer``
    (and its random generators when the checkpoint has as many ranks); return its step.
    Collective: every rank calls it. CheckpointMismatch if it is another model's."""
    state = training_state(model, optimizer)
    check_matches(path, {k: v.shape for k, v in state["model"].items()}, optimizer_settings(optimizer),
                  whole_model=False)
    world = dist.get_world_size() if dist.is_initialized() else 1
    if saved_world(path) != world:
        del state["rng"]
    with _quiet_without_group():
        _dcp().load(state, checkpoint_id=str(path), no_dist=not dist.is_initialized())
    model.load_state_dict(state["model"])
    _dcp().state_dict.set_optimizer_state_dict(model, optimizer, state["optim"], options=_optim_options())
    for rng in state.get("rng", {}).values():
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"], next(model.parameters()).device)
    return checkpoint_step(path)


def runtime_module(runtime) -> nn.ModuleDict:
    """A PipelineRuntime's blocks as one module whose names are the unpipelined model's."""
    return runtime.module()


def save_runtime(runtime, directory: PathLike, keep: int = DEFAULT_KEEP) -> Path:
    """Checkpoint a PipelineRuntime after its ``steps_done`` steps (collective)."""
    return save(directory, runtime.steps_done, runtime_module(runtime), runtime.optimizer, keep)


def load_runtime(runtime, path: PathLike) -> int:
    """Load a checkpoint into a PipelineRuntime of any schedule or rank count and set its step
    counter (collective); returns the step to continue after."""
    runtime.steps_done = load(path, runtime_module(runtime), runtime.optimizer)
    runtime.broadcast_tied()  # the group's first name's value, wherever the checkpoint came from
    return runtime.steps_done


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
