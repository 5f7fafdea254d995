"""Inputs at the edges stay bounded (issue 22): strict JSON, charts of bounded size however long
the run, CSV line ends of every platform, the library's own arguments refused in one clear
error, and the environment variables ``pipesched train`` reads checked before any rank starts.

The one-line refusals of the console script for each flag and hostile CSV are rows of
``tests/test_cli_bad_input.py``; these are the cases that need more than a row.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_env, concurrently
from pipesched import Costs, Schedule, build_schedule, simulate
from pipesched.environment import TorchrunRank, backend, torchrun_rank
from pipesched.errors import ConfigError
from pipesched.jsontext import json_text
from pipesched.render.layout import MAX_AXIS_WIDTH, Scale

SCRIPT = Path(sys.executable).with_name("pipesched")
MEMORY_CAP = 2 << 30  # address space per command: a chart that grew with the run's length would exceed it
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _strict(text: str):
    def refuse(token: str):
        raise AssertionError(f"JSON holds {token}, which strict parsers refuse")

    return json.loads(text, parse_constant=refuse)


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _pipesched(argv: list[str], cwd: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, timeout=timeout,
                          env=env or cli_env(), cwd=cwd, preexec_fn=_capped)


def test_json_text_writes_null_for_what_strict_parsers_refuse():
    assert json_text({"a": math.inf, "b": [math.nan, 1.5, -math.inf], "c": (2, "x")}) == \
        '{"a": null, "b": [null, 1.5, null], "c": [2, "x"]}'


def test_the_widest_cost_range_gives_finite_strict_json(tmp_path):
    # the largest costs, latency and imbalance accepted: every number printed stays finite
    extreme = ["--costs", "1e9,1e9,1e-6", "--comm", "1e9", "--stage-multipliers", "1e6,1e-6"]
    commands = [["simulate", "zb-v", "-p", "2", "-m", "4", *extreme, "--json"],
                ["compare", "-p", "2", "-m", "4", *extreme, "--json"],
                ["draw", "zb-v", "-p", "2", "-m", "4", *extreme, "-o", "trace.json"]]
    done = concurrently(lambda argv: _pipesched(argv, tmp_path), commands, workers=3)
    for argv, out in zip(commands, done):
        assert out.returncode == 0, (argv, out.stderr)
    simulated, rows = _strict(done[0].stdout), _strict(done[1].stdout)
    assert math.isfinite(simulated["makespan"]) and simulated["makespan"] > 1e9
    assert all(math.isfinite(row["makespan"]) for row in rows if "makespan" in row)
    _strict((tmp_path / "trace.json").read_text())


def test_a_long_run_is_drawn_in_a_chart_of_bounded_width():
    for makespan in (1.0, 30.0, 3.3e7, 1e15):
        scale = Scale.fit(makespan)
        assert scale.px_per_unit * makespan <= MAX_AXIS_WIDTH * (1 + 1e-12)


def test_charts_of_huge_costs_stay_small_files_in_bounded_memory(tmp_path):
    # once a 94 MB SVG (--costs 1e6,...) and 16 GB of memory (--comm 1e12, now refused)
    huge = ["-p", "2", "-m", "4", "--costs", "1e6,1.4e6,0.6e6"]
    commands = [["draw", "1f1b", *huge, "-o", "big.svg"], ["draw", "1f1b", *huge, "-o", "big.json"],
                ["draw", "1f1b", "-p", "2", "-m", "4", "--comm", "1e9", "-o", "comm.svg"],
                ["report", *huge, "-o", "big.html"]]
    done = concurrently(lambda argv: _pipesched(argv, tmp_path), commands, workers=2)
    for argv, out in zip(commands, done):
        assert out.returncode == 0, (argv, out.stderr[-500:])
    for name in ("big.svg", "big.json", "comm.svg"):
        assert (tmp_path / name).stat().st_size < 200_000, name
    assert (tmp_path / "big.html").stat().st_size < 2_000_000
    width = float(re.search(r'<svg[^>]* width="([0-9.]+)"', (tmp_path / "big.svg").read_text()).group(1))
    assert width <= MAX_AXIS_WIDTH + 200


def test_a_png_too_large_to_paint_is_refused_in_one_line():
    pytest.importorskip("PIL")
    from pipesched.render.png import gantt_png

    result = simulate(build_schedule("1f1b", 256, 512))  # 256 rows over the widest axis
    with pytest.raises(ConfigError, match="million pixels: write .svg instead"):
        gantt_png(result)


@pytest.mark.parametrize("ending", ["\r", "\r\n", "\n"])
def test_every_platforms_line_ends_read_the_same(ending):
    rows = ["0F0,0F1,0B0,0B1", "1F0,1B0,1F1,1B1"]
    read = Schedule.from_csv(ending.join(rows) + ending)
    assert read.orders == Schedule.from_csv("\n".join(rows) + "\n").orders and read.ranks == 2


def test_a_csv_with_mac_line_ends_simulates_through_the_console_script(tmp_path):
    (tmp_path / "mac.csv").write_bytes(build_schedule("1f1b", 2, 4).to_csv().replace("\r\n", "\n").replace("\n", "\r").encode())
    out = _pipesched(["simulate", "--csv", "mac.csv", "--json"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert _strict(out.stdout)["ranks"] == 2


@pytest.mark.parametrize("call, words", [
    (lambda: build_schedule(None, 2, 4), "a schedule name is text such as 'zb-v'"),
    (lambda: build_schedule(3, 2, 4), "a schedule name is text"),
    (lambda: build_schedule("1f1b", 2, 4, costs="1,1,1"), "costs must be a pipesched.Costs"),
    (lambda: simulate(None), "simulate takes a pipesched.Schedule"),
    (lambda: simulate(build_schedule("1f1b", 2, 4), "1,1,1"), "costs must be a pipesched.Costs"),
    (lambda: Costs(F=1e308), "cost F must be a finite number from 1e-06 to 1e+09"),
    (lambda: Costs(comm=math.nan), "comm must be a finite number"),
    (lambda: Costs(stage_multipliers="1.3,1"), "stage multipliers '1.3,1' must be a sequence of numbers"),
    (lambda: Costs(stage_multipliers=(1.0, 1e308)), "stage multiplier 1 must be a finite number"),
    (lambda: Costs.parse(" "), "--costs is empty"),
])
def test_the_library_refuses_wrong_arguments_with_a_clear_config_error(call, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        call()


@pytest.mark.skipif(not HAS_TORCH, reason="PipelineRuntime needs PyTorch")
@pytest.mark.parametrize("timeout_s", [math.nan, math.inf, -1.0, 0.0])
def test_a_runtime_whose_waits_would_never_end_is_refused(timeout_s):
    import torch

    from pipesched.runtime.executor import PipelineRuntime, RuntimeOptions
    from pipesched.runtime.stages.staged_model import StagedModel

    with pytest.raises(ConfigError, match="timeout_s must be a finite number"):
        PipelineRuntime(StagedModel(lambda i: torch.nn.Linear(2, 2), 2, torch.zeros(1, 2)),
                        build_schedule("1f1b", 2, 4), lambda out, target: out.sum(), lambda ps: torch.optim.SGD(ps, lr=0.1),
                        options=RuntimeOptions(timeout_s=timeout_s))


TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("environ, words", [
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost"}, "sets RANK, WORLD_SIZE, MASTER_ADDR but not MASTER_PORT"),
    ({"RANK": "0"}, "unset them (unset RANK)"),
    ({**TORCHRUN, "RANK": "2"}, "RANK='2' is not what torchrun sets: expected a whole number from 0 to 1"),
    ({**TORCHRUN, "WORLD_SIZE": "two"}, "WORLD_SIZE='two'"),
    ({**TORCHRUN, "MASTER_PORT": "70000"}, "MASTER_PORT='70000'"),
    ({**TORCHRUN, "MASTER_ADDR": " "}, "MASTER_ADDR is empty"),
    ({**TORCHRUN, "LOCAL_RANK": "-1"}, "LOCAL_RANK='-1'"),
])
def test_a_partial_or_inconsistent_torchrun_environment_is_refused(environ, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        torchrun_rank(environ)


def test_torchruns_environment_and_none_are_read():
    assert torchrun_rank({}) is None
    assert torchrun_rank({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}) is None  # pipesched's local ranks
    assert torchrun_rank({**TORCHRUN, "LOCAL_RANK": "1"}) == TorchrunRank(1, 2, 1)


@pytest.mark.parametrize("environ, cuda, expected", [
    ({}, False, "gloo"), ({}, True, "nccl"), ({"PIPESCHED_BACKEND": "gloo"}, True, "gloo"),
    ({"PIPESCHED_BACKEND": "NCCL"}, True, "nccl"), ({"PIPESCHED_BACKEND": "bogus"}, True, "not known"),
    ({"PIPESCHED_BACKEND": "nccl"}, False, "needs CUDA GPUs"),
])
def test_the_backend_variable_is_checked(environ, cuda, expected):
    if expected in ("gloo", "nccl"):
        assert backend(environ, cuda=cuda) == expected
    else:
        with pytest.raises(ConfigError, match=expected):
            backend(environ, cuda=cuda)


@pytest.mark.skipif(not HAS_TORCH, reason="pipesched train needs PyTorch")
def test_train_refuses_a_bad_environment_in_one_line_before_any_rank_starts(tmp_path):
    # once: a wait as a torchrun rank, then 65 lines; per-rank tracebacks for a bad backend
    cases = [({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, "but not MASTER_PORT"),
             ({"PIPESCHED_BACKEND": "bogus"}, "PIPESCHED_BACKEND='bogus' is not known: use gloo or nccl")]
    if not __import__("torch").cuda.is_available():
        cases.append(({"PIPESCHED_BACKEND": "nccl"}, "PIPESCHED_BACKEND=nccl needs CUDA GPUs"))

    def run(extra: dict) -> subprocess.CompletedProcess:
        env = {**cli_env(), **extra}
        return subprocess.run([str(SCRIPT), "train", "--ranks", "2", "--steps", "1"], capture_output=True, text=True,
                              timeout=120, env=env, cwd=tmp_path)

    for (extra, words), out in zip(cases, concurrently(run, [extra for extra, _ in cases], workers=3)):
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("pipesched: error: "), (extra, out.stderr)
        assert words in lines[0]


def test_an_error_quoting_a_huge_value_stays_one_short_line(tmp_path):
    commands = [["simulate", "x" * 50_000], ["simulate", "1f1b", "--costs", "1," * 50_000],
                ["simulate", "1f1b", "-p", "1" * 5000]]
    for argv, out in zip(commands, concurrently(lambda argv: _pipesched(argv, tmp_path), commands, workers=3)):
        last = out.stderr.rstrip("\n").splitlines()[-1]
        assert out.returncode == 2 and last.startswith("pipesched: error: ") and len(out.stderr) < 2000, argv[:2]
