"""A run that ends before its last step (Ctrl-C, SIGTERM or SIGHUP, a failure) still leaves its
summary and its report, up to its last logged step.

Its ranks are gone by then, and what rank 0 held with them: what is left is the metrics file,
which rank 0 writes and flushes each logging interval. So a run asked for a report but for no
``--metrics`` file writes its metrics to a temporary file all the same (removed when the
command ends); when the run stops, the launcher reads that file back and writes from it the
terminal summary, the ``--summary`` file and the ``--report`` page, the exception then going on
to say why the run stopped. For that file to hold this run's lines only, a fresh run (no
``--resume``) first moves an earlier run's lines aside (:func:`_start_afresh`).
"""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from ...errors import ConfigError, RunFailure


def run_keeping_outputs(run: Callable, cfg, summary_path: Optional[Path]):
    """``run(cfg)`` (a TrainConfig); if it stops or fails, the outputs up to its last logged
    step (:func:`write_stopped_outputs`) before the exception goes on (under torchrun, in rank
    0's process only: it is the one that writes the metrics)."""
    from ...environment import torchrun_rank
    from ...runtime.launching.launch import RunStopped

    under = torchrun_rank()
    if under is not None and under.rank != 0:  # torchrun: rank 0's process writes the outputs, once
        return run(cfg)
    if cfg.resume_from is None and cfg.loop.metrics_path is not None:  # before any rank writes a line
        _start_afresh(Path(cfg.loop.metrics_path))
    kept = None
    if cfg.loop.report_path is not None and cfg.loop.metrics_path is None:
        try:
            fd, kept = tempfile.mkstemp(prefix="pipesched-metrics-", suffix=".jsonl")
            os.close(fd)
            cfg = replace(cfg, loop=replace(cfg.loop, metrics_path=kept))
        except OSError:  # no room for it: the run goes on, and writes its report only if it ends
            kept = None
    try:
        return run(cfg)
    except (RunStopped, KeyboardInterrupt, RunFailure):
        write_stopped_outputs(cfg, summary_path)
        raise
    finally:
        if kept is not None:
            with suppress(OSError):  # removed meanwhile: nothing to tidy
                os.unlink(kept)


def _start_afresh(path: Path) -> None:
    """An earlier run's lines in the ``--metrics`` file of a run without ``--resume`` moved to a
    side file (:func:`~.metrics_file.set_aside_earlier`), one line saying where."""
    from .metrics_file import set_aside_earlier

    try:
        kept = set_aside_earlier(path)
    except OSError as err:
        raise ConfigError(f"--metrics {path} holds an earlier run's lines, which could not be moved aside "
                          f"({err.strerror}): name another file") from None
    if kept is not None:
        print(f"pipesched: --metrics {path} held an earlier run's lines: moved to {kept} "
              "(a run without --resume starts its file afresh)", file=sys.stderr, flush=True)


def write_stopped_outputs(cfg, summary_path: Optional[Path]) -> None:
    """The summary and report of a stopped run from its metrics file, each one line saying
    what was written; nothing where no interval was logged."""
    from .metrics_file import read_metrics
    from .outputs import print_stopped, stopped_summary

    if cfg.loop.metrics_path is None:
        return
    try:
        rows = read_metrics(Path(cfg.loop.metrics_path), "--metrics", cut_short=True)
    except ConfigError:  # nothing logged yet (or the file was lost): nothing to sum up
        return
    last = rows[-1]["step"]
    print_stopped(rows)
    written = []
    if summary_path is not None:
        from ...jsontext import json_text
        from ...outfiles import write_atomic

        written += _tried(summary_path, lambda: write_atomic(summary_path, json_text(stopped_summary(cfg, rows), indent=1)),
                          "run summary")
    if cfg.loop.report_path is not None:
        from .run_report import write_run_report

        report = Path(cfg.loop.report_path)
        written += _tried(report, lambda: write_run_report(report, cfg.schedule, None, rows, cfg.layout), "run report")
    for line in written:
        print(f"{line}, up to step {last}", flush=True)


def _tried(path: Path, write: Callable[[], object], what: str) -> list[str]:
    """``write()``: the line saying so, or nothing (the run's own failure is what the command says)."""
    try:
        write()
    except (OSError, ConfigError):
        return []
    return [f"wrote {path} ({what})"]
