"""How ``advise`` says to run its recommendation: every command and call it prints is accepted as
printed and rebuilds the simulated schedule; ``pipesched train`` only where train would take it."""

from __future__ import annotations

import shlex

import pytest

import pipesched
from pipesched import Costs, simulate
from pipesched.advise import advise
from pipesched.advise.estimate import Hardware, TransformerCosts
from pipesched.advise.howto import build_call, export_command, guidance
from pipesched.advise.transformer import TransformerSpec
from pipesched.cli.advise_print import train_command
from pipesched.advise.layout import advise_layouts
from pipesched.registry import get_family

HANDCRAFTED = [get_family(n) for n in ("1f1b", "interleaved-1f1b", "zb-h1", "zb-h2")]
COST_STEERED = [get_family(n) for n in ("1f1b", "zb-h2", "zb-v", "v-half")]


def _layouts(dp_bandwidth: float):
    spec = TransformerSpec(8, 1024, 512, 2, vocab=32000)
    model = TransformerCosts(spec, 1, Hardware(bandwidth=50, gpu_memory=40))
    return advise_layouts(4, model, 32, dp_bandwidth=dp_bandwidth, families=HANDCRAFTED)


def test_the_printed_build_call_rebuilds_the_simulated_schedule_costs_and_limit_included():
    costs = Costs(1, 1.4, 0.6, comm=0.1)
    best = advise(4, 4, microbatches=8, costs=costs, families=COST_STEERED, workers=1).recommended
    call = build_call(best, 4)
    assert "costs=pipesched.Costs(F=1, B=1.4, W=0.6, comm=0.1)" in call and "memory_limit=4" in call
    rebuilt = eval(call, {"pipesched": pipesched})
    assert simulate(rebuilt, best.costs).makespan == pytest.approx(best.makespan)


def test_the_printed_export_command_writes_that_schedule(cli, tmp_path):
    costs = Costs(1, 1.4, 0.6, comm=0.1)
    best = advise(4, 4, microbatches=8, costs=costs, families=COST_STEERED, workers=1).recommended
    command = shlex.split(export_command(best, 4))
    assert command[:2] == ["pipesched", "export"] and "--costs" in command
    target = tmp_path / "best.csv"
    assert cli(*command[1:], "-o", str(target)).returncode == 0
    loaded = pipesched.Schedule.from_csv(target.read_text())
    assert simulate(loaded, best.costs).makespan == pytest.approx(best.makespan)


@pytest.mark.parametrize("dp_bandwidth", [1000, 0.1])  # a fast link favours replicas, a slow one depth
def test_a_layout_is_run_on_the_users_model_under_torchrun_with_pp_times_dp_processes(dp_bandwidth):
    best = _layouts(dp_bandwidth).recommended
    text = "\n".join(guidance(best.candidate, best.pp, best.dp))
    assert "pipesched train" not in text  # its built-in models are not the model the advice planned
    assert f"WORLD_SIZE = pp x dp = {best.pp} x {best.dp} = 4" in text
    assert "torchrun --nproc-per-node 4 " in text
    assert "PipelineRuntime(StagedModel(build_block, num_blocks, sample_input" in text
    assert (f"mesh=init_pipeline_mesh(pp={best.pp}, dp={best.dp})" in text) == (best.dp > 1)
    rebuilt = eval(build_call(best.candidate, best.pp), {"pipesched": pipesched})
    assert rebuilt.ranks == best.pp
    assert simulate(rebuilt, best.candidate.costs).makespan == pytest.approx(best.candidate.makespan)


def test_train_is_suggested_only_for_a_built_in_model_whose_blocks_fill_the_stages():
    best = advise(2, None, microbatches=8, families=[get_family("zb-v")], workers=1).recommended  # 4 stages
    assert train_command(best, 2, 1, "zb-v.csv", "mlp", 64) == (
        "pipesched train --model mlp --csv zb-v.csv --ranks 2 --batch-size 64")
    assert train_command(best, 2, 1, "zb-v.csv", "mlp", 60) is None  # 60 samples do not split into 8
    assert train_command(best, 8, 1, "zb-v.csv", "mlp", 64) is None  # 16 stages: mlp has 9 blocks
    assert train_command(best, 2, 2, "zb-v.csv", "gpt", 64) == (
        "pipesched train --model gpt --csv zb-v.csv --ranks 2 --dp 2 --batch-size 64")


def test_advise_gpus_prints_how_to_run_the_layout_and_no_train_command(cli):
    done = cli(
        "advise", "--gpus", "4", "--layers", "8", "--hidden", "1024", "--seq-len", "512",
        "--microbatch-size", "2", "--global-batch", "32", "--gpu-memory", "40", "--bandwidth", "50",
        "--schedules", "1f1b,zb-h1", "--workers", "1",
    )
    assert done.returncode == 0, done.stderr
    assert "pipesched train" not in done.stdout
    for line in ("Build it: pipesched export ", "Run it on your own model", "schedule = pipesched.build_schedule(",
                 "runtime = PipelineRuntime(", "Launch: torchrun --nproc-per-node 4 ", "Layers per stage"):
        assert line in done.stdout
    call = next(line for line in done.stdout.splitlines() if "schedule = pipesched.build_schedule(" in line)
    assert call.rstrip().endswith(")"), "the call is printed on one line, never folded, so it can be copied"
