"""``advise --gpus G --gpus-per-node N``: whole layouts (pp x dp x dp_shard x tp) from the command line."""

import json

import pytest

MODEL = ["--layers", "8", "--hidden", "1024", "--heads", "16", "--seq-len", "512", "--vocab", "32000",
         "--microbatch-size", "1", "--global-batch", "32", "--gpu-memory", "40", "--bandwidth", "100",
         "--schedules", "1f1b,interleaved-1f1b,zb-h1"]
NODES = ["--gpus", "16", "--gpus-per-node", "4", "--node-bandwidth", "10"]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    from conftest import run_cli

    report = tmp_path_factory.mktemp("layout") / "layout.html"
    return {
        "all": run_cli("advise", *NODES, *MODEL, "--json"),
        "fixed": run_cli("advise", *NODES, *MODEL, "--tp", "2", "--dp-shard", "2", "-p", "2", "--json",
                         "--report", str(report)),
        "table": run_cli("advise", *NODES, *MODEL, "--tp", "4"),
        "report": report,
    }


def test_json_rows_carry_every_dimension_and_multiply_to_the_gpus(searched):
    done = searched["all"]
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert all(r["pp"] * r["dp"] * r["dp_shard"] * r["tp"] == 16 for r in rows)
    assert [r["step_time"] for r in rows] == sorted(r["step_time"] for r in rows)
    assert len({(r["pp"], r["dp"], r["dp_shard"], r["tp"]) for r in rows}) > 3
    assert {r["tp"] for r in rows} <= {1, 2, 4}  # tp stays inside a node of 4


def test_each_dimension_can_be_fixed(searched):
    done = searched["fixed"]
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert rows and all((r["pp"], r["dp"], r["dp_shard"], r["tp"]) == (2, 2, 2, 2) for r in rows)


def test_each_row_gives_every_pipeline_rank_s_bytes_and_the_fullest_is_its_memory(searched):
    for row in json.loads(searched["fixed"].stdout):  # pp 2 x dp 2 x dp_shard 2 x tp 2
        ranks = row["bytes_per_rank"]
        assert len(ranks) == 2 and all(r[k] > 0 for r in ranks for k in
                                       ("params", "grads", "optimizer", "gathered", "unsharded_grads", "buffers", "activations"))
        assert all(r["params"] == r["grads"] and r["optimizer"] >= 2 * r["params"] for r in ranks)  # fp32 shards, Adam
        # the peak holds each stage's unsharded gradients only from its first backward (pp 2 x dp_shard 2)
        assert all(r["peak"] <= sum(v for k, v in r.items() if k != "peak") for r in ranks)
        assert max(r["peak"] for r in ranks) == pytest.approx(row["memory_gb"] * 1e9, rel=1e-12)  # GB = 1e9 bytes


def test_the_report_draws_each_rank_s_gathers_and_reductions_on_a_lane_of_its_own(searched):
    html = searched["report"].read_text()
    assert "2 FSDP shards \u00d7 tp 2" in html
    for rank in (0, 1):
        assert f"all-gather of stage {rank}  rank {rank}" in html and f"gradient reduction of stage {rank}  rank {rank}" in html


def test_the_table_explains_the_pick_and_says_how_to_run_it(searched):
    done = searched["table"]
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "Recommendation: pp " in text and "tp 4: 4 all-reduces per layer" in text
    assert "runner-up" in text and "--parallelism.tensor_parallel_degree 4" in text
    assert "pipesched train: --csv" in text and "Layouts left out" in text
    words = " ".join(text.split())  # the console wraps long lines
    assert "GB on the fullest rank (pipeline rank" in words and "optimizer state" in words and "activations at peak" in words


@pytest.mark.parametrize("extra, message", [
    (["--tp", "3"], "--tp 3 does not divide --gpus 16"),
    (["--dp-shard", "0"], "--dp-shard must be"),
])
def test_bad_layout_input_is_one_line_exit_2(cli, extra, message):
    done = cli("advise", *NODES, *MODEL, *extra)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr


def test_layout_flags_without_their_mode_are_refused(cli):
    alone = cli("advise", *MODEL, "--tp", "2")
    assert alone.returncode == 2 and "ignores --tp" in alone.stderr
    no_nodes = cli("advise", "--gpus", "16", *MODEL, "--dp-shard", "2")
    assert no_nodes.returncode == 2 and "needs --gpus-per-node" in no_nodes.stderr
    no_network = cli("advise", "--gpus", "16", "--gpus-per-node", "4", *MODEL)
    assert no_network.returncode == 2 and "--node-bandwidth" in no_network.stderr
