"""The torchtitan settings that run one of our CSVs (pure Python: no torch, no torchtitan).

torchtitan runs a CSV with ``pipeline_parallel_schedule_csv`` through torch's
``_PipelineScheduleRuntime``, but it lays the stages out from ``pipeline_parallel_schedule``:
``ZBVZeroBubble`` and ``DualPipeV`` give the V layout (rank ``r`` builds stages ``r`` and
``2p-1-r``), every other name the loop layout (rank ``r`` builds ``r, r+p, ...``); a
single-stage name builds one stage per rank, a multi-stage one two unless
``pipeline_parallel_layers_per_stage`` says otherwise. The microbatch count is
``training.local_batch_size // pipeline_parallel_microbatch_size``. So the schedule name must
match the CSV's placement and the batch sizes its microbatch count, or the stages that run are
not the ones the CSV names (a V-placed CSV under a loop name loads, then hangs).

Versions differ in how they take the settings. torchtitan 0.3.0 (which needs torch 2.14) reads
no TOML job file: the keys go on its command line (:func:`command_line`), with
``--training.disable_cuda_graphs`` (it refuses pipeline parallelism with CUDA graphs) and, for a
CSV with split backwards (I and W), full or no activation checkpointing: under its default,
selective, the first W fails with "Trying to backward an extra time". torchtitan 0.2 reads a
TOML job file (``--job.config_file``) with the same sections and keys (:func:`settings_toml`).
"""

from __future__ import annotations

import shlex
from typing import Optional

from ..errors import ConfigError
from ..schedule import Schedule

# torchtitan's schedule names (torch's get_schedule_class) -> (stage layout, stages per rank;
# None: a multi-stage schedule, two per rank unless pipeline_parallel_layers_per_stage says more)
LAYOUTS: dict[str, tuple[str, Optional[int]]] = {
    "1F1B": ("loop", 1), "GPipe": ("loop", 1), "PipelineScheduleSingle": ("loop", 1),
    "Interleaved1F1B": ("loop", None), "LoopedBFS": ("loop", None), "InterleavedZeroBubble": ("loop", None),
    "PipelineScheduleMulti": ("loop", None), "ZBVZeroBubble": ("v", 2), "DualPipeV": ("v", 2),
}
# the activation checkpointing a CSV with split backwards needs (selective fails at the first W)
SPLIT_BACKWARD_AC = "full"


def torchtitan_schedule_name(schedule: Schedule) -> str:
    """The ``pipeline_parallel_schedule`` whose stage layout is this schedule's placement."""
    if schedule.pipelines > 1:
        raise ConfigError(
            f"{schedule.name} runs {schedule.pipelines} model copies as separate pipelines, which "
            "torchtitan (one pipeline, one copy) cannot run: export dualpipev for its V layout"
        )
    style = schedule.style
    if style == "v":
        return "DualPipeV" if schedule.overlapped else "ZBVZeroBubble"
    if style == "loop":
        return "1F1B" if schedule.chunks == 1 else "Interleaved1F1B"
    raise ConfigError(
        f"{schedule.name} places its stages neither in a loop nor in a V: torchtitan builds only "
        "those two layouts, so it cannot run this CSV"
    )


def check_schedule_name(schedule: Schedule, name: str) -> str:
    """``name`` if torchtitan lays the stages out under it as the CSV places them; else ConfigError
    (torchtitan would build other stages than the CSV runs and wait until its timeout)."""
    fitting = torchtitan_schedule_name(schedule)
    if name not in LAYOUTS:
        raise ConfigError(f"torchtitan schedule {name!r} is not known: use {fitting} for this CSV "
                          f"(known: {', '.join(LAYOUTS)})")
    style, per_rank = LAYOUTS[name]
    if style != LAYOUTS[fitting][0] or (per_rank == 1) != (schedule.chunks == 1):
        built = "a V (rank r: r and 2p-1-r)" if style == "v" else (
            "a loop, one stage per rank" if per_rank == 1 else "a loop (rank r: r, r+p, ...)")
        placed = "a V" if schedule.style == "v" else f"a loop of {schedule.chunks} stage(s) per rank"
        raise ConfigError(
            f"torchtitan schedule {name} lays the stages out in {built}, but {schedule.name}'s CSV places "
            f"them in {placed}: use {fitting} (another name loads the CSV, then hangs)"
        )
    return name


def torchtitan_settings(schedule: Schedule, csv_path: str, microbatch_size: int = 1,
                        name: Optional[str] = None) -> dict[str, dict]:
    """torchtitan's config sections and keys that run ``schedule`` from ``csv_path`` (``name``:
    a schedule name to use instead of the fitting one, checked against the placement)."""
    if microbatch_size < 1:
        raise ConfigError(f"microbatch size must be at least 1, got {microbatch_size}")
    chosen = torchtitan_schedule_name(schedule) if name is None else check_schedule_name(schedule, name)
    settings: dict[str, dict] = {
        "training": {"local_batch_size": schedule.microbatches * microbatch_size},
        "parallelism": {
            "pipeline_parallel_degree": schedule.ranks,
            "pipeline_parallel_schedule": chosen,
            "pipeline_parallel_schedule_csv": csv_path,
            "pipeline_parallel_microbatch_size": microbatch_size,
        },
    }
    if schedule.split_backward:
        settings["activation_checkpoint"] = {"mode": SPLIT_BACKWARD_AC}
    return settings


def command_line(schedule: Schedule, csv_path: str, microbatch_size: int = 1, name: Optional[str] = None) -> list[str]:
    """torchtitan 0.3.0's command-line arguments for the settings (it reads no TOML job file):
    ``--section.key VALUE`` each, CUDA graphs off, and the activation checkpointing subcommand
    (``activation-checkpoint:full``) for a CSV with split backwards."""
    args = []
    for section, keys in torchtitan_settings(schedule, csv_path, microbatch_size, name).items():
        if section == "activation_checkpoint":
            continue  # a tyro subcommand in 0.3.0, not a key
        for key, value in keys.items():
            args += [f"--{section}.{key}", str(value)]
    args.append("--training.disable_cuda_graphs")
    if schedule.split_backward:
        args.append(f"activation-checkpoint:{SPLIT_BACKWARD_AC}")
    return args


def settings_toml(schedule: Schedule, csv_path: str, microbatch_size: int = 1, name: Optional[str] = None) -> str:
    """The settings for both versions: torchtitan 0.3.0's command line (as comments), then the
    TOML job-config fragment torchtitan 0.2 reads, with why each is set."""
    settings = torchtitan_settings(schedule, csv_path, microbatch_size, name)
    flags = " ".join(shlex.quote(arg) for arg in command_line(schedule, csv_path, microbatch_size, name))
    lines = [
        f"# torchtitan settings for {schedule.describe()}",
        "# torchtitan 0.3.0 (needs torch 2.14) reads no TOML: add these to its command line, after --module and --config:",
        f"#   {flags}",
        "# torchtitan 0.2 reads this file as its job config (--job.config_file FILE):",
    ]
    if schedule.chunks > 2:
        lines.append(
            f"# {schedule.chunks} stages per rank: also set parallelism.pipeline_parallel_layers_per_stage "
            f"(or module_fqns_per_model_part) so that the model splits into {schedule.stages} stages"
        )
    if schedule.split_backward:
        lines.append(f"# split backwards (I, W): activation checkpointing {SPLIT_BACKWARD_AC} or none "
                     "(under selective the first W fails: \"Trying to backward an extra time\")")
    if schedule.overlapped:
        lines.append("# OVERLAP_F_B cells run their forward, then their backward (torch's runtime)")
    for section, keys in settings.items():
        lines.append(f"\n[{section}]")
        for key, value in keys.items():
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)
