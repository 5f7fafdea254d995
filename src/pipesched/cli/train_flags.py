"""``pipesched train``'s own options, declared once in groups (as the planning options are in
:mod:`.options`): the run (model, steps, batch, optimizer, waits and precision), the schedule and
layout, checkpoints, and what the run writes. Each group reaches the command as one dataclass
(:func:`~.option_group.option_group`); the loop and data groups live in :mod:`.train_loop` and
:mod:`.train_data`. Defaults come from where the runtime keeps them (a timeout, the checkpoints
kept), never written twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from ..bounds import DEFAULT_TIMEOUT_S
from ..runtime.checkpoints.checkpoint_files import DEFAULT_KEEP
from . import options as opt
from . import train_hf
from .gather_flags import GatherLimit, GatherPlan, GatherTime
from .option_group import option_group
from .renamed import deprecated_option as renamed_option
from .train_layout import Dp, DpShard, Dtype, Tp

DEFAULT_LR, DEFAULT_OPTIMIZER, DEFAULT_MODEL, DEFAULT_SCHEDULE = 0.05, "sgd", "mlp", "1f1b"


@dataclass(frozen=True)
class RunFlags:
    """What is trained and how: the model, the steps and batch, the optimizer, waits, precision."""

    model: str = DEFAULT_MODEL
    steps: int = 10
    batch_size: int = 64
    seed: int = 0
    lr: float = DEFAULT_LR
    optimizer: str = DEFAULT_OPTIMIZER
    timeout: float = DEFAULT_TIMEOUT_S
    skip_nonfinite: bool = False
    clip_grad_norm: Optional[float] = None
    dtype: str = "fp32"
    verbose: bool = False


@dataclass(frozen=True)
class ScheduleFlags:
    """Which schedule (named, auto, zb-auto or a CSV), its size, and the layout it runs on."""

    schedule: str = DEFAULT_SCHEDULE
    costs: Optional[str] = None
    comm: Optional[float] = None
    memory_limit: Optional[str] = None
    recompute_input: Optional[float] = None
    ranks: int = 4
    microbatches: Optional[int] = None
    chunks: Optional[int] = None
    stage_blocks: Optional[str] = None
    csv: Optional[Path] = None
    recompute: Optional[str] = None
    dp: int = 1
    dp_shard: int = 1
    tp: int = 1
    gather_plan: str = "torch"
    gather_time: Optional[str] = None
    gather_limit: Optional[int] = None


@dataclass(frozen=True)
class CheckpointFlags:
    checkpoint_dir: Optional[Path] = None
    checkpoint_every: Optional[int] = None
    checkpoint_keep: int = DEFAULT_KEEP
    resume: bool = False


@dataclass(frozen=True)
class OutputFlags:
    """What the run writes besides its checkpoints (and where a Hugging Face model's data and weights come from)."""

    save_params: Optional[Path] = None
    trace: Optional[Path] = None
    summary: Optional[Path] = None
    old_json_path: Optional[Path] = None  # --json, renamed --summary
    data: Optional[Path] = None
    hf_weights: Optional[Path] = None
    save_hf: Optional[Path] = None


run_options = option_group("run", RunFlags, (
    ("model", str, typer.Option(DEFAULT_MODEL, "--model", help="mlp (residual MLP stack), gpt (char-level GPT) or "
                                "hf:CONFIG.json (a Hugging Face causal LM, docs/huggingface.md).")),
    ("steps", int, typer.Option(10, "--steps", help="Optimizer steps.")),
    ("batch_size", int, typer.Option(64, "--batch-size", help="Samples per step, split into the microbatches.")),
    ("seed", int, typer.Option(0, "--seed", help="Seed of the weights (block i uses seed+i) and the data.")),
    ("lr", float, typer.Option(DEFAULT_LR, "--lr", help="Learning rate.")),
    ("optimizer", str, typer.Option(DEFAULT_OPTIMIZER, "--optimizer",
                                    help="sgd or adamw (torch's defaults but the learning rate).")),
    ("timeout", float, typer.Option(DEFAULT_TIMEOUT_S, "--timeout", help="Seconds a rank waits for a peer before "
                                    "failing (a single rank: without finishing a step).")),
    ("skip_nonfinite", bool, typer.Option(False, "--skip-nonfinite", help="Skip steps whose loss is NaN/inf instead of stopping.")),
    ("clip_grad_norm", Optional[float], typer.Option(None, "--clip-grad-norm", help="Clip the whole model's gradient "
                                                     "norm (over every rank) to this, as torch's clip_grad_norm_.")),
    ("dtype", str, Dtype),
    ("verbose", bool, typer.Option(False, "--verbose", help="Show the warnings and notes of the libraries the run "
                                   "uses (transformers' are kept out of the terminal otherwise, once per rank).")),
))

schedule_options = option_group("sched", ScheduleFlags, (
    ("schedule", str, typer.Option(DEFAULT_SCHEDULE, "--schedule", "-s", help="Schedule name, none for the "
                                   "single-process reference, or auto (measure, then pipesched advise picks); "
                                   "zb-auto measures the costs first and plans for them.")),
    ("costs", Optional[str], typer.Option(None, "--costs", help="With --schedule zb-auto: plan with these costs F,B,W "
                                          "(e.g. 1,1.4,0.6; 1,1,1: unit costs) instead of measuring them (a short "
                                          "profile before training).")),
    ("comm", Optional[float], typer.Option(None, "--comm", help="With --costs: latency of every cross-rank transfer, in cost units.")),
    ("memory_limit", Optional[str], typer.Option(None, "--memory-limit", help="Peak activations per rank the schedule "
                                                 "must fit: with --schedule auto or zb-auto in M_B or bytes (40GiB, "
                                                 "512MiB; zb-auto then measures the sizes and may recompute); with "
                                                 "another named schedule in M_B (the V family builds to it, the "
                                                 "others check it); with --dp-shard or --tp in bytes, the weights, "
                                                 "gradients, optimizer state, gather window and peak activations "
                                                 "each rank is predicted to hold (activations on fake tensors, "
                                                 "under --tp on a fake mesh; not for a model that fails on them, "
                                                 "which the refusal says), refused before any rank starts if they "
                                                 "do not fit.")),
    ("recompute_input", Optional[float], opt.RecomputeInput),
    ("ranks", int, opt.Ranks),
    ("microbatches", Optional[int], typer.Option(None, "--microbatches", "-m", help="Microbatches per step (default 8; a CSV brings its own).")),
    ("chunks", Optional[int], opt.Chunks),
    ("stage_blocks", Optional[str], typer.Option(None, "--stage-blocks", help="Blocks per stage, e.g. 2,3,3,2 "
                                                 "(dualpipe: per stage of one model copy; default: balanced for the placement).")),
    ("csv", Optional[Path], typer.Option(None, "--csv", help="Run a schedule from a torch CSV (compute_only or compute_comms format).")),
    ("recompute", Optional[str], typer.Option(None, "--recompute", help="Recompute activations in the backward "
                                              "(activation checkpointing): all, none, or the model's stage indices "
                                              "such as 0,2 (dualpipe: 0..p-1, recomputed in both model copies).")),
    ("dp", int, Dp),
    ("dp_shard", int, DpShard),
    ("tp", int, Tp),
    ("gather_plan", str, GatherPlan),
    ("gather_time", Optional[str], GatherTime),
    ("gather_limit", Optional[int], GatherLimit),
))

checkpoint_options = option_group("ckpt", CheckpointFlags, (
    ("checkpoint_dir", Optional[Path], typer.Option(None, "--checkpoint-dir", help="Save checkpoints here "
                                                    "(torch.distributed.checkpoint, one folder per step; at least after the last step).")),
    ("checkpoint_every", Optional[int], typer.Option(None, "--checkpoint-every", help="With --checkpoint-dir: also save every N steps.")),
    ("checkpoint_keep", int, typer.Option(DEFAULT_KEEP, "--checkpoint-keep", help="How many of the newest checkpoints to keep.")),
    ("resume", bool, typer.Option(False, "--resume", help="Continue from the newest complete checkpoint in "
                                  "--checkpoint-dir up to --steps (the total), under any schedule or rank count.")),
))

output_options = option_group("out", OutputFlags, (
    ("save_params", Optional[Path], typer.Option(None, "--save-params", help="Write the trained state_dict (.pt), unpipelined names.")),
    ("trace", Optional[Path], typer.Option(None, "--trace", help="Write the measured timeline of every step (.json).")),
    ("summary", Optional[Path], typer.Option(None, "--summary", help="Write the run's summary (.json): losses, median "
                                             "step, activation bytes per rank.")),
    ("old_json_path", Optional[Path], renamed_option("--json", "--summary")),
    ("data", Optional[Path], train_hf.Data),
    ("hf_weights", Optional[Path], train_hf.Weights),
    ("save_hf", Optional[Path], train_hf.SaveHf),
))
