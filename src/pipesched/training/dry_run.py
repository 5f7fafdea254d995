"""``pipesched train --dry-run``: the run ``train`` would launch, once every check it makes before
launching has passed, and no rank started.

A dry run answers "will this command run?" in seconds instead of after the ranks have started
(each imports torch and builds its stages): the train job (training/job/job.py) goes through the same checks
in the same order (options, layout, model and family, memory limits, data and tokenizer, the
checkpoint folder), so a refusal is the same line and exit code; then, in place of the launch, it
prints :func:`describe`. The schedules that measure the model before planning (``auto``,
``zb-auto`` without enough ``--costs``) would start processes to measure it, so a dry run plans
nothing for them and says so.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from ..parallel_layout import ParallelLayout
from ..schedule import Schedule


def describe(run_toml: str, plan: Optional[Schedule], layout: Optional[ParallelLayout],
             measured: Optional[str] = None) -> str:
    """The dry run's report: ``run_toml`` (the run as ``--print-config`` prints it), then the
    schedule and the layout of the processes the run would start. ``plan`` None is the
    one-process reference, unless ``measured`` names the schedule (``auto``, ``zb-auto``) that
    the launch would measure first, whose ``layout`` then has the ``--ranks`` asked for."""
    if measured is not None:
        schedule = f"{measured}: planned at launch from the model's measured costs (a dry run measures nothing)"
    elif plan is None:
        schedule = "none: the one-process reference"
    else:
        schedule = f"{plan.name}, ranks={plan.ranks} microbatches={plan.microbatches} chunks={plan.chunks}"
    if layout is None:
        processes = "layout: pp 1 x dp 1 x dp_shard 1 x tp 1 = 1 process"
    else:
        processes = (f"layout: pp {layout.pp} x dp {layout.dp_replicate} x dp_shard {layout.dp_shard} x tp {layout.tp}"
                     f" = {layout.world} {'process' if layout.world == 1 else 'processes'}")
    return (f"{run_toml.rstrip()}\n\n# dry run: every check before launch passed; no rank was started\n"
            f"# schedule: {schedule}\n# {processes}\n")


@contextmanager
def no_new_folder(folder: Optional[Path]) -> Iterator[None]:
    """Remove, on leaving, the empty folders made inside: ``folder`` and its ancestors that did
    not exist on entering (the checkpoint folder's check creates it to prove it can write there:
    a dry run leaves nothing behind). None: nothing to watch."""
    missing = [] if folder is None else [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        yield
    finally:
        for made in missing:  # the innermost first
            try:
                made.rmdir()
            except OSError:  # not made, or not empty: kept
                break
