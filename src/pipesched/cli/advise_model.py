"""``pipesched advise``'s ways of costing a model besides ``--costs``: a model description and
its hardware (:class:`ModelFlags`, turned into the cost model by :func:`transformer_costs`), or
``--profile``, which measures a model (:class:`ProfileFlags`). Each is declared as one group
(:func:`option_group`): the description on its dataclass's fields (:mod:`pipesched.declared`), so that
``--config FILE.toml`` reads it as a run file's ``[model]`` table; the profile's as typer's
declarations. The constants below are the one place of a default applied where a flag was left out.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, fields
from pathlib import Path
from typing import Optional

import typer

from ..advise.estimate import DEFAULT_TFLOPS, Hardware, TransformerCosts
from ..advise.transformer import ATTENTION_KERNELS, DTYPE_BYTES, TransformerSpec
from ..advise.transformer_experts import Experts
from ..declared import old_spelling, option
from ..errors import ConfigError
from . import options as opt
from .advise_flags import SearchFlags, or_default
from .declared import typer_options, with_old_spellings
from .option_group import option_group

ACTIVATION_DTYPE = "bf16"  # --activation-dtype left out
ATTENTION = "flash"  # --attention left out
PROFILED_MODEL, PROFILED_BATCH, PROFILED_STEPS = "mlp", 64, 4  # --model, --batch-size, --profile-steps left out
PROFILED_MICROBATCHES = 8  # --microbatches left out with --profile


def _model(flag: str, help: str) -> Field:
    """A field of the model description: not given by default, ``flag``'s range (:data:`options.RANGES`)."""
    return option(None, help, check=opt.in_range(flag))


@dataclass(frozen=True)
class ModelFlags:
    """The model description and the hardware it runs on, as typed (None: not given), or read
    from the ``[model]`` table of ``--config FILE.toml`` (each key a flag's name, dashes as underscores)."""

    layers: Optional[int] = _model("--layers", "Model: transformer layers L.")
    hidden: Optional[int] = _model("--hidden", "Model: hidden size h.")
    seq_len: Optional[int] = _model("--seq-len", "Model: sequence length s.")
    heads: Optional[int] = _model("--heads", "Model: attention heads a (default h/64).")
    vocab: Optional[int] = _model("--vocab", "Model: vocabulary V (adds embedding and head).")
    attention: Optional[str] = option(None, f"Model: {ATTENTION} (default; SDPA keeps no score matrix) or eager "
                                      "(keeps a*s*s per sequence).")
    activation_dtype: Optional[str] = option(None, f"Model: activation precision, {ACTIVATION_DTYPE} (default), "
                                             "fp16 or fp32.")
    experts: Optional[int] = _model("--experts", "Model: routed experts per MoE layer E (a mixture of experts).")
    experts_per_token: Optional[int] = _model("--experts-per-token", "Model, with --experts: routed experts per token.")
    expert_hidden: Optional[int] = _model("--expert-hidden", "Model, with --experts: each expert's intermediate width.")
    shared_experts: Optional[int] = _model("--shared-experts", "Model, with --experts: experts on every token (default 0).")
    dense_layers: Optional[int] = _model("--dense-layers", "Model, with --experts: first layers with a dense MLP "
                                         "(default 0).")
    gpu_memory: Optional[float] = _model("--gpu-memory", "GB per device: sets the memory limit.")
    bandwidth: Optional[float] = _model("--bandwidth", "GB/s between neighbouring ranks: sets comm.")
    flops: Optional[float] = _model("--flops", f"Effective TFLOP/s per device (default {DEFAULT_TFLOPS:g}).")
    old_dtype: Optional[str] = old_spelling("activation_dtype", "--dtype")
    config: Optional[Path] = option(None, "Read the model description (and its hardware) from this TOML file: its "
                                    "table named model, e.g. layers = 32 (docs/advise.md); flags given as well "
                                    "override it.", in_file=False)

    def resolved(self) -> ModelFlags:
        """The description: ``--dtype`` (the old spelling, with a warning) read as
        ``--activation-dtype``, then each flag not given taken from ``--config``'s file."""
        values = with_old_spellings("advise", ModelFlags, {f.name: getattr(self, f.name) for f in fields(self)})
        if self.config is not None:
            from ..training.config.run_file import read_run_file

            from_file = read_run_file(self.config, {"model": ModelFlags})
            values.update({name: value for name, value in from_file.items() if values[name] is None})
        return ModelFlags(**{**values, "config": None})

    def given(self) -> dict[str, object]:
        """Every flag of the description (flag -> value; None: not given), in the order a
        refusal names them."""
        return {"--layers": self.layers, "--hidden": self.hidden, "--seq-len": self.seq_len, "--heads": self.heads,
                "--vocab": self.vocab, "--gpu-memory": self.gpu_memory, "--bandwidth": self.bandwidth,
                "--flops": self.flops, "--attention": self.attention, "--activation-dtype": self.activation_dtype,
                **self.expert_flags()}

    def expert_flags(self) -> dict[str, object]:
        """The mixture of experts' flags (flag -> value; None: not given)."""
        return {"--experts": self.experts, "--experts-per-token": self.experts_per_token,
                "--expert-hidden": self.expert_hidden, "--shared-experts": self.shared_experts,
                "--dense-layers": self.dense_layers}

    def mixture(self) -> Optional[Experts]:
        """The experts described (None: a dense model; ConfigError on an incomplete description)."""
        if self.experts is None:
            given = [flag for flag, value in self.expert_flags().items() if value is not None]
            if given:
                raise ConfigError(f"{', '.join(given)} describe experts: give --experts too")
            return None
        if self.experts_per_token is None or self.expert_hidden is None:
            raise ConfigError("--experts needs --experts-per-token and --expert-hidden")
        return Experts(self.experts, self.experts_per_token, self.expert_hidden, or_default(self.shared_experts, 0),
                       or_default(self.dense_layers, 0))

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


MODEL_OPTIONS = typer_options(ModelFlags)
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
        raise ConfigError("give --memory-limit (activations, M_B), --rank-memory-limit (bytes) or --gpu-memory (GB, all of a device), not two")
    dtype = model.activation_dtype if model.activation_dtype is not None else ACTIVATION_DTYPE  # an empty value is refused below
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"--activation-dtype {dtype!r} is not known: use one of {', '.join(DTYPE_BYTES)}")
    attention = model.attention if model.attention is not None else ATTENTION
    if attention not in ATTENTION_KERNELS:
        raise ConfigError(f"--attention {attention!r} is not known: use one of {', '.join(ATTENTION_KERNELS)}")
    spec = TransformerSpec(model.layers, model.hidden, model.seq_len, search.microbatch_size, heads=model.heads,
                           vocab=model.vocab, attention=attention, dtype_bytes=DTYPE_BYTES[dtype], experts=model.mixture())
    hardware = Hardware(tflops=model.flops if model.flops is not None else DEFAULT_TFLOPS,
                        bandwidth=model.bandwidth, gpu_memory=model.gpu_memory)
    return TransformerCosts(spec, ranks, hardware, limit=memory_limit, memory_bytes=limit_bytes)
