"""Checkpoints with torch.distributed.checkpoint (DCP): sharded per rank, loadable into any layout.

A checkpoint is a folder ``DIR/step-000012`` in DCP's format (one file per rank and DCP's
``.metadata``). Every rank writes what it owns, keyed by the unpipelined model's names
(``"3.fc1.weight"``):

- ``model.<name>``: the parameters and buffers of its blocks, a tied weight (one weight under
  several names: an embedding and its head) under its group's first name only, on every rank
  that holds a copy (:func:`tied_view`);
- ``optim.state.<name>.<key>`` and ``optim.param_groups.<name>.<key>``: its optimizer's state and
  settings per parameter (``torch.distributed.checkpoint.state_dict`` with
  ``flatten_optimizer_state_dict``, made for pipelines: no per-rank parameter indices);
- ``rng.<rank>.cpu`` (and ``.cuda``): its random generators.

The step counter is the folder's name; the data position is the step (pipesched's batches are a
function of the seed and the step). Because nothing is keyed by stage or rank, a checkpoint loads
under another schedule or rank count: each rank asks DCP for the entries of the blocks it owns
(random generators are restored only on the same rank count, where they mean the same thing).
Sharded stages (FSDP2, tensor parallelism) hold DTensors: each rank writes its piece of each
weight and of its optimizer state under the same unsplit name, DCP records where the piece sits
in the whole tensor, and any layout reads back the pieces it owns, one process included
(``benchmarks/checkpoint_layouts.py``). Split experts (``ep``), plain tensors of a rank's
experts, are saved and loaded as their rows of the whole layer's tensors (``pieces``:
:mod:`.checkpoint_pieces`), so any EP degree reads them back.
A tied weight and its optimizer state are saved and asked for under the group's first name
whether one rank holds the group as one ``Parameter`` (a V placement) or ranks hold copies (a
loop placement), so either resumes the other's checkpoint; loading then broadcasts the group's
value to every copy.

A checkpoint is complete or absent: DCP writes into ``DIR/.step-000012.partial``; once every
rank's data and the metadata are on disk the coordinator checksums them into the folder's
manifest (:mod:`.checkpoint_files`) and renames it to its final name (atomic), so a crash while
saving leaves the previous checkpoint the newest complete one. ``--resume`` verifies the
manifest and falls back past a damaged checkpoint; one run at a time holds the folder
(:mod:`.folder_lock`). A failed save or load is one line naming the step and the file
(:class:`CheckpointWriteError`, :class:`CheckpointUnreadable`), on every rank.
"""

from __future__ import annotations

import os
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch import nn

from ...errors import ConfigError, RunFailure
from . import checkpoint_files as files
from .checkpoint_files import (  # noqa: F401  (where checkpoints live: part of this module's API)
    DEFAULT_KEEP,
    CheckpointUnreadable,
    checkpoint_step,
    complete_checkpoints,
    latest,
    prepare_directory,
    step_dir,
)
from .checkpoint_names import model_shapes, same_name, tied_view  # noqa: F401  (part of this module's API)
from .checkpoint_pieces import Pieces, as_local, as_whole
from .checkpoint_strided import portable, restored
from .checkpoint_writes import reason, writer

PathLike = Union[str, Path]
STEP_DIR = files.STEP_DIR
PARTIAL = ".partial"


def _dcp():
    """torch.distributed.checkpoint, imported on first use: it adds over a second of imports to
    every process, which runs that never checkpoint should not pay."""
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.state_dict  # noqa: F401  (dcp.state_dict below)

    return dcp


def import_now() -> None:
    """Import what saving and loading use now: in a launcher about to fork its ranks, so that each
    rank starts with it (a rank that imports it at its first save spends that second between two
    reports of progress)."""
    _dcp()


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


class CheckpointWriteError(RunFailure):
    """A checkpoint could not be written (a full disk, a folder removed): the run stops, and the
    message names the step, the folder, why, and the newest checkpoint still on disk."""


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


def saved_entries(path: PathLike) -> Mapping:
    """DCP's index of a checkpoint: entry name -> metadata (tensors have ``.size``);
    CheckpointUnreadable when its ``.metadata`` is missing or damaged."""
    try:
        return _dcp().FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except BaseException as err:  # a pickle error, UnicodeDecodeError, EOFError of an empty file...
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        raise CheckpointUnreadable(
            f"{_step_name(path)}could not read {Path(path) / '.metadata'}: {reason(err)}"
        ) from None


def _step_name(path: PathLike) -> str:
    match = STEP_DIR.match(Path(path).name)
    return f"step {int(match.group(1))}: " if match else ""


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
         keep: int = DEFAULT_KEEP, pieces: Optional[Pieces] = None) -> Path:
    """Save this process's share as ``directory/step-NNNNNN``, complete (with its manifest) or
    not at all; keep the newest ``keep`` checkpoints; ``pieces``: the entries this rank holds a
    block of rows of (:mod:`.checkpoint_pieces`). Collective: every rank of the process group
    calls it, and every rank raises the same CheckpointWriteError when any part fails."""
    final = step_dir(directory, step)
    partial = final.with_name(f".{final.name}{PARTIAL}")
    coordinator = not dist.is_initialized() or dist.get_rank() == 0
    previous = next((p for p in reversed(complete_checkpoints(directory)) if p != final), None)
    if coordinator:
        files.remove_partials(directory)  # this step's, left by a crash, and any older one
    _barrier()
    error = None
    try:
        with _quiet_without_group():
            _dcp().save(portable(as_whole(training_state(model, optimizer), pieces)), checkpoint_id=str(partial), storage_writer=writer(partial), no_dist=not dist.is_initialized())
    except BaseException as err:  # DCP's CheckpointException is a BaseException
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        error = reason(err)
    if coordinator and error is None:  # DCP returns once every rank's data and the metadata are written and synced
        try:
            files.write_manifest(partial, step)
            if final.exists():
                shutil.rmtree(final)
            os.rename(partial, final)
            _sync_folder(final.parent)
        except OSError as err:
            error = reason(err)
    error = _first_error(error)
    if error is not None:
        if coordinator:
            shutil.rmtree(partial, ignore_errors=True)  # frees what the failed save took
        kept = f"{previous} is intact" if previous is not None else "no earlier checkpoint was saved"
        raise CheckpointWriteError(f"step {step}: could not write {final}: {error}; {kept}")
    if coordinator:  # the newest, just verified by its writing, is never among those removed
        files.rotate(directory, keep, final)
    _barrier()
    return final


def _first_error(mine: Optional[str]) -> Optional[str]:
    """The first rank's error of a collective save (None if every rank succeeded), on every rank."""
    if not dist.is_initialized():
        return mine
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return next((e for e in every if e is not None), None)


def load(path: PathLike, model: nn.Module, optimizer: torch.optim.Optimizer, pieces: Optional[Pieces] = None) -> int:
    """Load what this process owns from checkpoint ``path`` into ``model`` and ``optimizer``
    (and its random generators when the checkpoint has as many ranks); return its step.
    Collective: every rank calls it. CheckpointMismatch if it is another model's."""
    state = as_whole(training_state(model, optimizer), pieces)  # shapes: the whole tensors'
    check_matches(path, {k: v.shape for k, v in state["model"].items()}, optimizer_settings(optimizer),
                  whole_model=False)
    world = dist.get_world_size() if dist.is_initialized() else 1
    if saved_world(path) != world:
        del state["rng"]
    live, state = state, portable(state)
    try:
        with _quiet_without_group():
            _dcp().load(state, checkpoint_id=str(path), no_dist=not dist.is_initialized())
    except BaseException as err:  # DCP's CheckpointException is a BaseException
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        raise CheckpointUnreadable(f"{_step_name(path)}could not read {path}: {reason(err)}") from None
    state = as_local(restored(state, live), pieces)
    model.load_state_dict(state["model"])
    _dcp().state_dict.set_optimizer_state_dict(model, optimizer, state["optim"], options=_optim_options())
    for rng in state.get("rng", {}).values():
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"], next(model.parameters()).device)
    return checkpoint_step(path)


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
