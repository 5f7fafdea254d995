"""``pipesched advise``'s ways of costing a model besides ``--costs``: a model description and
its hardware (:class:`ModelFlags`, turned into the cost model by :func:`transformer_costs`), or
``--profile``, which measures a model (:class:`ProfileFlags`). Each is declared as one group
(:func:`option_group`); typer's declaration is the one place a flag's default is written, the
constants below the one place of a default applied where the flag was left out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import typer

from ..advise.estimate import DEFAULT_TFLOPS, Hardware, TransformerCosts
from ..advise.transformer import ATTENTION_KERNELS, DTYPE_BYTES, TransformerSpec
from ..errors import ConfigError
from .advise_flags import SearchFlags, or_default
from .option_group import option_group
from .renamed import deprecated_option, renamed

ACTIVATION_DTYPE = "bf16"  # --activation-dtype left out
ATTENTION = "flash"  # --attention left out
PROFILED_MODEL, PROFILED_BATCH, PROFILED_STEPS = "mlp", 64, 4  # --model, --batch-size, --profile-steps left out
PROFILED_MICROBATCHES = 8  # --microbatches left out with --profile


@dataclass(frozen=True)
class ModelFlags:
    """The model description and the hardware it runs on, as typed (None: not given)."""

    layers: Optional[int]
    hidden: Optional[int]
    seq_len: Optional[int]
    heads: Optional[int]
    vocab: Optional[int]
    attention: Optional[str]
    dtype: Optional[str]
    gpu_memory: Optional[float]
    bandwidth: Optional[float]
    flops: Optional[float]
    old_dtype: Optional[str]  # --dtype: the old spelling of --activation-dtype

    def renamed(self) -> ModelFlags:
        """The flags with ``--dtype`` (the old spelling, with a warning) read as ``--activation-dtype``."""
        return replace(self, dtype=renamed("advise", "--dtype", "--activation-dtype", self.old_dtype, self.dtype),
                       old_dtype=None)

    def given(self) -> dict[str, object]:
        """Every flag of the description (flag -> value; None: not given), in the order a
        refusal names them."""
        return {"--layers": self.layers, "--hidden": self.hidden, "--seq-len": self.seq_len, "--heads": self.heads,
                "--vocab": self.vocab, "--gpu-memory": self.gpu_memory, "--bandwidth": self.bandwidth,
                "--flops": self.flops, "--attention": self.attention, "--activation-dtype": self.dtype}

    @property
    def described(self) -> bool:
        """Whether any flag describes a model (the advisor then costs it from the description)."""
        return any(value is not None for value in self.given().values())


@dataclass(frozen=True)
class ProfileFlags:
    """``--profile`` and what it runs, as typed (None: not given)."""

    profile: bool
    model_name: Optional[str]
    batch_size: Optional[int]
    profile_steps: Optional[int]

    def run(self) -> tuple[str, int, int]:
        """The model, samples per step and steps the profile runs (their defaults where not given)."""
        return (or_default(self.model_name, PROFILED_MODEL), or_default(self.batch_size, PROFILED_BATCH),
                or_default(self.profile_steps, PROFILED_STEPS))


MODEL_OPTIONS: tuple[tuple[str, object, object], ...] = (
    ("layers", Optional[int], typer.Option(None, "--layers", help="Model: transformer layers L.")),
    ("hidden", Optional[int], typer.Option(None, "--hidden", help="Model: hidden size h.")),
    ("seq_len", Optional[int], typer.Option(None, "--seq-len", help="Model: sequence length s.")),
    ("heads", Optional[int], typer.Option(None, "--heads", help="Model: attention heads a (default h/64).")),
    ("vocab", Optional[int], typer.Option(None, "--vocab", help="Model: vocabulary V (adds embedding and head).")),
    ("attention", Optional[str], typer.Option(
        None, "--attention",
        help=f"Model: {ATTENTION} (default; SDPA keeps no score matrix) or eager (keeps a*s*s per sequence).")),
    ("dtype", Optional[str], typer.Option(
        None, "--activation-dtype", help=f"Model: activation precision, {ACTIVATION_DTYPE} (default), fp16 or fp32.")),
    ("gpu_memory", Optional[float], typer.Option(None, "--gpu-memory", help="GB per device: sets the memory limit.")),
    ("bandwidth", Optional[float], typer.Option(None, "--bandwidth", help="GB/s between neighbouring ranks: sets comm.")),
    ("flops", Optional[float], typer.Option(
        None, "--flops", help=f"Effective TFLOP/s per device (default {DEFAULT_TFLOPS:g}).")),
    ("old_dtype", Optional[str], deprecated_option("--dtype", "--activation-dtype")),
)
PROFILE_OPTIONS: tuple[tuple[str, object, object], ...] = (
    ("profile", bool, typer.Option(
        False, "--profile", help="Measure the costs: run a few steps of --model on --ranks local ranks.")),
    ("model_name", Optional[str], typer.Option(
        None, "--model", help=f"With --profile: {PROFILED_MODEL} (default), gpt or hf:CONFIG.json (train's models).")),
    ("batch_size", Optional[int], typer.Option(
        None, "--batch-size", help=f"With --profile: samples per step (default {PROFILED_BATCH}).")),
    ("profile_steps", Optional[int], typer.Option(
        None, "--profile-steps", help=f"With --profile: steps to measure (default {PROFILED_STEPS}).")),
)


def model_options(command):
    """Give ``pipesched advise`` the model description in place of its ``model: ModelFlags``."""
    return option_group("model", ModelFlags, MODEL_OPTIONS)(command)


def profile_options(command):
    """Give ``pipesched advise`` the profile's options in place of its ``profile: ProfileFlags``."""
    return option_group("profile", ProfileFlags, PROFILE_OPTIONS)(command)


def transformer_costs(model: ModelFlags, ranks: int, search: SearchFlags, memory_limit: Optional[float],
                      limit_bytes: Optional[float]) -> TransformerCosts:
    """The cost model of the described transformer on ``ranks`` pipeline ranks (ConfigError on a
    description that is incomplete, or combined with flags that give the costs another way)."""
    missing = [flag for flag, value in (("--layers", model.layers), ("--hidden", model.hidden),
                                        ("--seq-len", model.seq_len), ("--microbatch-size", search.microbatch_size))
               if value is None]
    if missing:
        raise ConfigError(
            "a model description needs --layers, --hidden, --seq-len and --microbatch-size; "
            f"missing {', '.join(missing)}"
        )
    for flag, value in search.given_costs().items():
        if value is not None:
            raise ConfigError(f"{flag} cannot be combined with a model description (the model gives the costs)")
    if (memory_limit is not None or limit_bytes is not None) and model.gpu_memory is not None:
        raise ConfigError("give --memory-limit (activations) or --gpu-memory (GB, all of a device), not both")
    dtype = model.dtype if model.dtype is not None else ACTIVATION_DTYPE  # an empty value is refused below
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"--activation-dtype {dtype!r} is not known: use one of {', '.join(DTYPE_BYTES)}")
    attention = model.attention if model.attention is not None else ATTENTION
    if attention not in ATTENTION_KERNELS:
        raise ConfigError(f"--attention {attention!r} is not known: use one of {', '.join(ATTENTION_KERNELS)}")
    spec = TransformerSpec(model.layers, model.hidden, model.seq_len, search.microbatch_size, heads=model.heads,
                           vocab=model.vocab, attention=attention, dtype_bytes=DTYPE_BYTES[dtype])
    hardware = Hardware(tflops=model.flops if model.flops is not None else DEFAULT_TFLOPS,
                        bandwidth=model.bandwidth, gpu_memory=model.gpu_memory)
    return TransformerCosts(spec, ranks, hardware, limit=memory_limit, memory_bytes=limit_bytes)
