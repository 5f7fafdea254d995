"""The torchtitan settings that run one of our CSVs (pure Python: no torch, no torchtitan).

torchtitan runs a CSV with ``pipeline_parallel_schedule_csv`` through torch's
``_PipelineScheduleRuntime``, but it lays the stages out from ``pipeline_parallel_schedule``:
``ZBVZeroBubble`` and ``DualPipeV`` give the V layout (rank ``r`` builds stages ``r`` and
``2p-1-r``), every other name the loop layout (rank ``r`` builds ``r, r+p, ...``); a
single-stage name builds one stage per rank, a multi-stage one two unless
``pipeline_parallel_layers_per_stage`` says otherwise. The microbatch count is
``training.local_batch_size // pipeline_parallel_microbatch_size``. So the schedule name must
match the CSV's placement and the batch sizes its microbatch count, or the stages that run are
not the ones the CSV names.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..schedule import Schedule


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


def torchtitan_settings(schedule: Schedule, csv_path: str, microbatch_size: int = 1) -> dict[str, dict]:
    """torchtitan's config sections and keys that run ``schedule`` from ``csv_path``."""
    if microbatch_size < 1:
        raise ConfigError(f"microbatch size must be at least 1, got {microbatch_size}")
    return {
        "training": {"local_batch_size": schedule.microbatches * microbatch_size},
        "parallelism": {
            "pipeline_parallel_degree": schedule.ranks,
            "pipeline_parallel_schedule": torchtitan_schedule_name(schedule),
            "pipeline_parallel_schedule_csv": csv_path,
            "pipeline_parallel_microbatch_size": microbatch_size,
        },
    }


def settings_toml(schedule: Schedule, csv_path: str, microbatch_size: int = 1) -> str:
    """The settings as a TOML fragment for a torchtitan job config, with why each is set."""
    settings = torchtitan_settings(schedule, csv_path, microbatch_size)
    lines = [f"# torchtitan settings for {schedule.describe()}"]
    if schedule.chunks > 2:
        lines.append(
            f"# {schedule.chunks} stages per rank: also set parallelism.pipeline_parallel_layers_per_stage "
            f"(or module_fqns_per_model_part) so that the model splits into {schedule.stages} stages"
        )
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
