"""The torchtitan example and `pipesched export --torchtitan`: torchtitan's key names, a stage
layout that matches the CSV's placement, the CSV's microbatch count, torch's CSV loader."""

from __future__ import annotations

from pathlib import Path

import pytest

import pipesched
from pipesched import ConfigError, Schedule, build_schedule
from pipesched.interop.torchtitan import torchtitan_schedule_name, torchtitan_settings

tomllib = pytest.importorskip("tomllib")

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"
EXAMPLE = EXAMPLES / "torchtitan-v-half.toml"
# the fields torchtitan's job config defines (Training / Parallelism in torchtitan/config)
TORCHTITAN_KEYS = {
    "training": {"local_batch_size"},
    "parallelism": {"pipeline_parallel_degree", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size"},
}


def test_the_example_is_what_export_writes(tmp_path, cli):
    done = cli("export", "v-half", "-p", "4", "-m", "8", "-o", "v-half-p4-m8.csv", "--torchtitan", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == EXAMPLE.read_text()
    assert (tmp_path / "v-half-p4-m8.csv").read_bytes() == (EXAMPLES / "v-half-p4-m8.csv").read_bytes()


def test_the_example_uses_torchtitans_keys_and_matches_its_csv():
    config = tomllib.loads(EXAMPLE.read_text())
    assert {section: set(keys) for section, keys in config.items()} == TORCHTITAN_KEYS
    pp = config["parallelism"]
    schedule = Schedule.from_csv((EXAMPLES / pp["pipeline_parallel_schedule_csv"]).read_text())
    pipesched.validate(schedule)
    assert schedule.style == "v"
    assert schedule.ranks == pp["pipeline_parallel_degree"]
    assert schedule.microbatches == config["training"]["local_batch_size"] // pp["pipeline_parallel_microbatch_size"]


@pytest.mark.torch
def test_the_example_schedule_name_gives_torchtitan_the_v_layout_and_its_csv_loads_in_torch():
    torch = pytest.importorskip("torch")  # noqa: F841
    from test_vs_torch import _mock_runtime
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV, ScheduleZBVZeroBubble, get_schedule_class

    pp = tomllib.loads(EXAMPLE.read_text())["parallelism"]
    # torchtitan's pipeline_module_split picks the V layout exactly for these two classes
    assert get_schedule_class(pp["pipeline_parallel_schedule"]) in (ScheduleZBVZeroBubble, ScheduleDualPipeV)
    runtime = _mock_runtime(pp["pipeline_parallel_degree"], 2, 8)
    runtime._load_csv(str(EXAMPLES / pp["pipeline_parallel_schedule_csv"]), format="compute_only")


@pytest.mark.parametrize("name, chunks, expected", [
    ("zb-v", 2, "ZBVZeroBubble"), ("v-min", 2, "ZBVZeroBubble"), ("dualpipev", 2, "DualPipeV"),
    ("1f1b", 1, "1F1B"), ("zb-h1", 1, "1F1B"), ("interleaved-zb", 3, "Interleaved1F1B"),
])
def test_the_schedule_name_follows_the_placement(name, chunks, expected):
    schedule = build_schedule(name, 4, 8, chunks=chunks)
    assert torchtitan_schedule_name(schedule) == expected
    settings = torchtitan_settings(schedule, "s.csv", microbatch_size=2)
    assert settings["training"]["local_batch_size"] == 16


def test_a_layout_torchtitan_cannot_build_is_refused():
    blocks = Schedule.from_csv("0F0,1F0,,,,,1B0,0B0\n,,2F0,3F0,3B0,2B0\n")  # stages 0,1 | 2,3
    assert blocks.style == "custom"
    with pytest.raises(ConfigError, match="neither in a loop nor in a V"):
        torchtitan_schedule_name(blocks)


def test_export_torchtitan_without_an_output_file_is_a_one_line_error(cli):
    done = cli("export", "zb-v", "-p", "2", "-m", "4", "--torchtitan")
    assert done.returncode == 2
    assert done.stderr.strip() == "pipesched: error: --torchtitan needs -o FILE: the settings point torchtitan at that CSV"
