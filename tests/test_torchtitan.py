"""The torchtitan example and `pipesched export --torchtitan`: torchtitan's key names, a stage
layout that matches the CSV's placement, the CSV's microbatch count, torch's CSV loader."""

from __future__ import annotations

from pathlib import Path

import pytest

import pipesched
from pipesched import ConfigError, Schedule, build_schedule
from pipesched.interop.torchtitan import command_line, torchtitan_schedule_name, torchtitan_settings

tomllib = pytest.importorskip("tomllib")

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"
EXAMPLE = EXAMPLES / "torchtitan-v-half.toml"
# the fields torchtitan's job config defines (Training / Parallelism in torchtitan/config)
TORCHTITAN_KEYS = {
    "training": {"local_batch_size"},
    "parallelism": {"pipeline_parallel_degree", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size"},
    "activation_checkpoint": {"mode"},  # 0.2's ActivationCheckpoint.mode: selective, full, memory_budget, none
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


def test_torchtitan_0_3_gets_every_setting_on_its_command_line():
    # 0.3.0 reads no TOML job file and refuses pipeline parallelism under CUDA graphs; a CSV with
    # split backwards fails at its first W under the default selective activation checkpointing
    flags = next(line for line in EXAMPLE.read_text().splitlines() if line.startswith("#   --")).lstrip("# ").split()
    config = tomllib.loads(EXAMPLE.read_text())
    given = dict(zip(flags[:-2:2], flags[1:-2:2]))
    assert given == {f"--{section}.{key}": str(value) for section, keys in config.items() if section != "activation_checkpoint"
                     for key, value in keys.items()}
    assert flags[-2:] == ["--training.disable_cuda_graphs", "activation-checkpoint:full"]
    assert config["activation_checkpoint"] == {"mode": "full"}


def test_a_csv_without_split_backwards_keeps_torchtitans_activation_checkpointing():
    schedule = build_schedule("1f1b", 2, 4)
    assert "activation_checkpoint" not in torchtitan_settings(schedule, "s.csv")
    assert command_line(schedule, "s.csv")[-1] == "--training.disable_cuda_graphs"


@pytest.mark.parametrize("name, chosen, words", [
    ("zb-v", "Interleaved1F1B", "places them in a V: use ZBVZeroBubble"),
    ("v-half", "1F1B", "places them in a V: use ZBVZeroBubble"),
    ("interleaved-1f1b", "ZBVZeroBubble", "use Interleaved1F1B"),
    ("interleaved-1f1b", "1F1B", "one stage per rank"),
    ("1f1b", "Interleaved1F1B", "use 1F1B"),
    ("zb-v", "Bogus", "torchtitan schedule 'Bogus' is not known: use ZBVZeroBubble"),
])
def test_export_refuses_a_torchtitan_schedule_that_lays_the_stages_out_otherwise(tmp_path, cli, name, chosen, words):
    done = cli("export", name, "-p", "2", "-m", "4", "-o", "s.csv", "--torchtitan", "--torchtitan-schedule", chosen, cwd=tmp_path)
    assert done.returncode == 2 and not done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesched: error: ") and words in lines[0], done.stderr
    assert not (tmp_path / "s.csv").exists()


def test_a_torchtitan_schedule_with_the_csvs_layout_is_taken(tmp_path, cli):
    done = cli("export", "interleaved-1f1b", "-p", "2", "-m", "4", "-o", "s.csv", "--torchtitan",
               "--torchtitan-schedule", "LoopedBFS", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(done.stdout)["parallelism"]["pipeline_parallel_schedule"] == "LoopedBFS"
