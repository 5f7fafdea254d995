"""``pipesched train``: run a schedule for real on local processes or under torchrun.

Its options are the run's one declaration (:class:`~pipesched.training.config.run_config.RunConfig`:
flags, or a ``--config`` file they override, resolved by :mod:`.run_options`). The command hands
the run to the train job (:func:`pipesched.training.job.job.run_job`: the checks, the assembly,
the launch), then writes the results it was asked for (:func:`_write_results`). A refusal is one
line, exit 2; a failed or stopped run one line, exit 1 (or 128 + the signal).
"""

from __future__ import annotations

from pathlib import Path

import typer

from ..training.config.run_config import RunConfig
from ..training.job.ended import JobEnded
from ..training.job.job import Trained, run_job
from ..training.job.say import say
from . import app
from .run_options import run_options


@app.command("train")
@run_options
def train(cfg: RunConfig) -> None:
    """Train a model with a pipeline schedule on real processes (gloo on CPU, NCCL under torchrun on GPUs)."""
    try:
        trained = run_job(cfg)
        if trained is not None:  # None: a torchrun rank other than 0
            _write_results(cfg, trained)
    except JobEnded as end:
        say(end.line)
        raise typer.Exit(code=end.code) from None


def _write_results(cfg: RunConfig, trained: Trained) -> None:
    """The summary on the terminal, then the files the run was asked to write (one line, exit 1, if
    one cannot be written: the trained weights are kept where it says)."""
    from ..training.job import hf_model
    from ..training.models import MODELS
    from ..training.report.outputs import OutputsLost, print_summary, write_outputs
    from ..training.report.run_report import run_rows, write_run_report

    ckpt, out, plan, result = cfg.checkpoint, cfg.outputs, trained.plan, trained.result
    rows = run_rows(result, trained.loop.metrics_path)  # the report's intervals: every figure shown comes from them
    print_summary(plan, result, rows)
    newest = None
    if ckpt.checkpoint_dir is not None:
        from ..runtime.checkpoints.checkpoint import latest

        newest = latest(ckpt.checkpoint_dir)
    try:
        write_outputs(plan, result, out.save_params, out.trace, out.summary, None if newest is None else str(newest), rows)
    except OutputsLost as err:
        raise JobEnded(f"pipesched: error: {err}", 1) from None
    report = trained.loop.report_path
    if report is not None:
        try:
            write_run_report(Path(report), plan, result, rows)
        except OSError as err:
            raise JobEnded(f"pipesched: error: the run finished, but could not write {report} ({err.strerror})", 1) from None
        typer.echo(f"wrote {report} (run report)")
    if cfg.model.model not in MODELS:  # hf:CONFIG.json
        hf_model.report_and_save(plan, trained.model_def, result.params, out.save_hf)
