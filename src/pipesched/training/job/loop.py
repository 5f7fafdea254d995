"""``pipesched train``'s loop: the learning-rate schedule and weight decay, the held-out
evaluation, the metrics a run writes, checked together before any process starts (one line,
exit 2) and handed to the ranks as one :class:`LoopOptions`. Each option's own range is on its
declaration (:mod:`pipesched.training.config.run_config`); here are the rules that tie options together.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from ...errors import ConfigError
from ...outfiles import check_output_folder, check_output_path
from ..config.run_config import RunConfig
from ..loop_options import LoopOptions
from ..lr_schedule import SCHEDULES


def loop_options(cfg: RunConfig) -> LoopOptions:
    """The checked :class:`LoopOptions` of ``cfg`` (ConfigError on a bad value)."""
    opt, ev, out, steps = cfg.optimizer, cfg.evaluation, cfg.outputs, cfg.training.steps
    if opt.lr_schedule not in SCHEDULES:
        raise ConfigError(f"--lr-schedule {opt.lr_schedule!r} is not known: use one of {', '.join(SCHEDULES)}")
    if not 0 <= opt.warmup < steps:
        raise ConfigError(f"--warmup must be from 0 to below --steps ({steps}), got {opt.warmup}")
    if not (math.isfinite(opt.min_lr) and 0 <= opt.min_lr <= opt.lr):
        raise ConfigError(f"--min-lr must be from 0 to --lr ({opt.lr:g}), got {opt.min_lr:g}")
    held_out = ev.eval_data is not None or ev.eval_share is not None
    if ev.eval_every is not None and not held_out:
        raise ConfigError("--eval-every needs held-out data: --eval-data FILE or --eval-share SHARE (with --model hf:...)")
    if out.metrics is not None:
        check_output_path(out.metrics, [".jsonl"])
    if out.report is not None:
        check_output_path(out.report, [".html"])
    if out.tensorboard is not None:
        check_output_folder(out.tensorboard)  # a file, or a folder that takes no files: refused before launch
        if importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("--tensorboard needs the tensorboard package: pip install 'pipesched[data]'")
    return LoopOptions(
        lr_schedule=opt.lr_schedule, warmup=opt.warmup, min_lr=opt.min_lr, weight_decay=opt.weight_decay,
        evaluate=held_out, eval_every=ev.eval_every, eval_batches=ev.eval_batches, log_every=out.log_every,
        metrics_path=_text(out.metrics), tensorboard_dir=_text(out.tensorboard), peak_tflops=out.peak_tflops,
        report_path=_text(out.report))


def bounded_evaluation(loop: LoopOptions, windows: int, batch_size: int, say: Callable[[str], None]) -> LoopOptions:
    """``loop`` with ``--eval-batches`` at most the batches that hold the ``windows`` distinct
    held-out windows once: an evaluation reads them in order and wraps around, so more batches
    only repeat them (``--eval-batches 100000000`` would re-evaluate the same windows for ever,
    every one of them built before the first step). Clamped with one line saying so."""
    distinct = max(1, -(-windows // batch_size))
    if not loop.evaluate or loop.eval_batches <= distinct:
        return loop
    say(f"pipesched: --eval-batches {loop.eval_batches}: the held-out data holds {windows} windows of --seq-len "
        f"tokens, {distinct} batch{'es' if distinct > 1 else ''} of --batch-size {batch_size}: evaluating {distinct}, "
        "each window once")
    return replace(loop, eval_batches=distinct)


def _text(path: Optional[Path]) -> Optional[str]:
    return None if path is None else str(path)
