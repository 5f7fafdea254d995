"""A ``pipesched train`` run as one value: a tree of sections (model, training, optimizer and
learning rate, schedule, layout, data, evaluation, checkpoints, outputs), after torchtitan's job
config. Each field is the one declaration of an option (:mod:`pipesched.declared`): its
default, help, range and rule; ``pipesched train``'s flags are generated from it
(:mod:`pipesched.cli.run_options`) and a run file (``--config run.toml``, :mod:`.run_file`) has one
table per section. Nothing here imports typer: the tree is the application's, the command line
one way to fill it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Optional

from ... import memory_limits as ml
from ... import shared_options as so
from ...bounds import DEFAULT_TIMEOUT_S
from ...declared import old_spelling, option, shared
from ...parallel_layout import ParallelLayout, runtime_layout
from ...runtime.checkpoints.checkpoint_files import DEFAULT_KEEP
from .checks import check_lr, check_positive, check_seed, check_share, check_timeout, check_weight_decay

WITH_HF = "With --model hf:CONFIG.json: "


@dataclass(frozen=True)
class ModelSection:
    model: str = option("mlp", "mlp (residual MLP stack), gpt (char-level GPT) or hf:CONFIG.json (a Hugging Face "
                        "causal LM, docs/huggingface.md).")
    dtype: str = option("fp32", "fp32, or bf16: fp32 weights and optimizer state, bf16 compute (autocast) and "
                        "stage-boundary tensors.")
    hf_weights: Optional[Path] = option(None, WITH_HF + "read the weights from this folder of safetensors "
                                        "(default: hf:FOLDER's own, else random init).")


@dataclass(frozen=True)
class TrainingSection:
    steps: int = option(10, "Optimizer steps.", least=1)
    batch_size: int = option(64, "Samples per step, split into the microbatches.", least=1)
    seed: int = option(0, "Seed of the weights (block i uses seed+i) and the data.", check=check_seed)
    timeout: float = option(DEFAULT_TIMEOUT_S, "Seconds a rank waits for a peer before failing (a single rank: "
                            "without finishing a step).", check=check_timeout)
    skip_nonfinite: bool = option(False, "Skip steps whose loss is NaN/inf instead of stopping.")
    clip_grad_norm: Optional[float] = option(None, "Clip the whole model's gradient norm (over every rank) to this, "
                                             "as torch's clip_grad_norm_.", check=check_positive)
    verbose: bool = option(False, "Show the warnings and notes of the libraries the run uses (transformers' are "
                           "kept out of the terminal otherwise, once per rank).")


@dataclass(frozen=True)
class OptimizerSection:
    optimizer: str = option("sgd", "sgd or adamw (torch's defaults but the learning rate).")
    lr: float = option(0.05, "Learning rate.", check=check_lr)
    lr_schedule: str = option("constant", "constant, cosine or linear: after --warmup, the learning rate decays "
                              "from --lr to --min-lr at the last step.")
    warmup: int = option(0, "Steps of linear warm-up: step s < N trains at --lr x (s+1)/(N+1).")
    min_lr: float = option(0.0, "The learning rate the cosine or linear decay ends at (the last step).")
    weight_decay: Optional[float] = option(None, "Weight decay of matrices (Linear, Embedding weights); biases and "
                                           "norm weights get none, as in the transformers Trainer (default: adamw "
                                           "0.01, sgd 0).", check=check_weight_decay)


@dataclass(frozen=True)
class ScheduleSection:
    schedule: str = option("1f1b", "Schedule name, none for the single-process reference, or auto (measure, then "
                           "pipesched advise picks); zb-auto measures the costs first and plans for them.", short=("-s",))
    microbatches: Optional[int] = option(None, "Microbatches per step (default 8; a CSV brings its own).",
                                         short=("-m",), least=1)
    chunks: Optional[int] = shared(so.CHUNKS, least=1)
    stage_blocks: Optional[str] = option(None, "Blocks per stage, e.g. 2,3,3,2 (dualpipe: per stage of one model "
                                         "copy; default: balanced for the placement).")
    csv: Optional[Path] = option(None, "Run a schedule from a torch CSV (compute_only or compute_comms format).")
    costs: Optional[str] = option(None, "With --schedule zb-auto: plan with these costs F,B,W (e.g. 1,1.4,0.6; "
                                  "1,1,1: unit costs) instead of measuring them (a short profile before training).")
    comm: Optional[float] = option(None, "With --costs: latency of every cross-rank transfer, in cost units.")
    memory_limit: Optional[str] = shared(ml.MEMORY_LIMIT)
    activation_limit: Optional[str] = shared(ml.ACTIVATION_LIMIT)
    rank_memory_limit: Optional[str] = shared(ml.RANK_MEMORY_LIMIT)
    recompute_input: Optional[float] = shared(so.RECOMPUTE_INPUT)
    recompute: Optional[str] = option(None, "Recompute activations in the backward (activation checkpointing): "
                                      "all, none, or the model's stage indices such as 0,2 (dualpipe: 0..p-1, "
                                      "recomputed in both model copies).")
    gather_plan: str = shared(so.GATHER_PLAN)
    gather_time: Optional[str] = shared(so.GATHER_TIME)
    gather_limit: Optional[int] = shared(so.GATHER_LIMIT)


@dataclass(frozen=True)
class LayoutSection:
    ranks: int = shared(so.RANKS, least=1)
    dp: int = option(1, "Data-parallel replicas of the pipeline: --ranks x --dp processes, each replica on its "
                     "shard of --batch-size.", least=1)
    dp_shard: int = option(1, "FSDP2 shards inside every stage: parameters, gradients and optimizer state split N "
                           "ways, gathered for compute (docs/layouts.md); each shard reads its own share of "
                           "--batch-size.", least=1)
    tp: int = option(1, "Tensor-parallel ranks inside every stage: attention heads and MLP columns split N ways "
                     "(gpt and Hugging Face models; docs/layouts.md).", least=1)
    ep: int = option(1, "Expert parallelism: each MoE layer's routed experts split N ways over the data-parallel "
                     "ranks (--dp x --dp-shard), tokens sent to their experts (docs/expert-parallel.md).", least=1)
    ep_pairs_in_turn: bool = option(False, "With --ep: run each overlapped pair's halves (dualpipev) one after "
                                    "the other, not interleaved at their all-to-alls (docs/expert-parallel.md).")

    def of(self, pp: int) -> ParallelLayout:
        """The layout of ``pp`` pipeline ranks (the schedule's: a CSV brings its own) cut this way, in
        the runtime's order: the one the run's ``TrainConfig`` carries to its ranks."""
        return runtime_layout(pp, self.dp, self.dp_shard, self.tp, self.ep)

    @property
    def sharded(self) -> bool:
        """Whether stages are split inside (FSDP shards or tensor parallelism)."""
        return self.of(1).sharded

    @property
    def data_ranks(self) -> int:
        """How many ways each global batch is split (replicas x shards)."""
        return self.of(1).dp


@dataclass(frozen=True)
class DataSection:
    data: Optional[Path] = option(None, WITH_HF + "the training data: token ids (.bin, .npy), or text (.txt, "
                                  ".jsonl's \"text\" fields, .parquet's text column) through the model folder's "
                                  "tokenizer.json (or --tokenizer's); without a tokenizer a file's bytes, each an id "
                                  "modulo the vocabulary (default: the shipped text; docs/training.md).")
    seq_len: Optional[int] = option(None, WITH_HF + "tokens per sample (default 64, or the model's positions if "
                                    "fewer).", least=2)
    tokenizer: Optional[Path] = option(None, WITH_HF + "the folder of the tokenizer.json that tokenizes text --data "
                                       "(default: the config's folder; without one, text is read as bytes).")
    packing: Optional[str] = option(None, WITH_HF + "across (default: a window's documents attend to each other) "
                                    "or documents (positions restart and attention stops at every end-of-sequence "
                                    "token).")


@dataclass(frozen=True)
class EvaluationSection:
    eval_data: Optional[Path] = option(None, WITH_HF + "held-out data (any --data format) evaluated every "
                                       "--eval-every steps.")
    eval_share: Optional[float] = option(None, WITH_HF + "hold out this share of --data's end for evaluation "
                                         "instead.", check=check_share)
    eval_every: Optional[int] = option(None, "Evaluate the held-out batches every N steps (and after the last): "
                                       "mean loss and perplexity.", least=1)
    eval_batches: int = option(4, "Held-out batches of --batch-size an evaluation takes (the same each time).",
                               least=1)


@dataclass(frozen=True)
class CheckpointSection:
    checkpoint_dir: Optional[Path] = option(None, "Save checkpoints here (torch.distributed.checkpoint, one folder "
                                            "per step; at least after the last step).")
    checkpoint_every: Optional[int] = option(None, "With --checkpoint-dir: also save every N steps.", least=1)
    checkpoint_keep: int = option(DEFAULT_KEEP, "How many of the newest checkpoints to keep.", least=1)
    resume: bool = option(False, "Continue from the newest complete checkpoint in --checkpoint-dir up to --steps "
                          "(the total), under any schedule or rank count.")


@dataclass(frozen=True)
class OutputsSection:
    save_params: Optional[Path] = option(None, "Write the trained state_dict (.pt), unpipelined names.")
    save_hf: Optional[Path] = option(None, WITH_HF + "write the trained model and its tokenizer to this "
                                     "folder, as from_pretrained loads them.")
    trace: Optional[Path] = option(None, "Write the measured timeline of every step (.json).")
    summary: Optional[Path] = option(None, "Write the run's summary (.json): losses, median step, activation "
                                     "bytes per rank.")
    old_json_path: Optional[Path] = old_spelling("summary", "--json")
    log_every: int = option(1, "Steps per logging interval (metrics, plain progress lines).", least=1)
    metrics: Optional[Path] = option(None, "Write each logging interval's metrics to this file (.jsonl): loss, "
                                     "lr, grad norm, tokens/s, MFU, step time, peak memory per rank, eval loss "
                                     "(--resume continues it; a fresh run moves an earlier run's lines aside).")
    tensorboard: Optional[Path] = option(None, "Write the metrics as TensorBoard scalars to this folder.")
    peak_tflops: Optional[float] = option(None, "One device's peak TFLOP/s, for the MFU (default: known CUDA "
                                          "devices' dense bf16 peak; on CPU no MFU).",
                                          check=check_positive)
    report: Optional[Path] = option(None, "Write an offline HTML report of the run (.html): loss and eval curves, "
                                    "throughput, memory.")
    dry_run: bool = option(False, "Check everything train checks before launching (options, layout, model, memory "
                           "limits, data, checkpoint folder), print the resolved run and its layout, and stop: no "
                           "rank starts.", in_file=False)


@dataclass(frozen=True)
class RunConfig:
    """The whole run; each section is one table of a run file."""

    model: ModelSection = field(default_factory=ModelSection)
    training: TrainingSection = field(default_factory=TrainingSection)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    layout: LayoutSection = field(default_factory=LayoutSection)
    data: DataSection = field(default_factory=DataSection)
    evaluation: EvaluationSection = field(default_factory=EvaluationSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    outputs: OutputsSection = field(default_factory=OutputsSection)


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(RunConfig)}
