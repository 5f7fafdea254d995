"""Data x pipeline parallelism: D replicas of a P-rank pipeline train like one process on the
global batch (gloo, CPU); the pieces that make it so (mesh layout, when each stage's gradients
are reduced, bf16 compute) and the CLI's checks of the layout."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from runtime_cases import assert_equal_to_reference, reference, run_data_parallel  # noqa: E402

import pipesched  # noqa: E402
from pipesched.runtime.comm.grad_sync import _buckets  # noqa: E402
from pipesched.runtime.engine.split_backward import (  # noqa: E402
    WeightGradStash,
    apply_weight_grads,
    make_weight_grads_deferrable,
)
from pipesched.runtime.launching.launch import spawn  # noqa: E402

pytestmark = [pytest.mark.torch]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_replicas_of_a_two_rank_pipeline_equal_one_process_on_the_global_batch():
    size = dict(blocks=5, dim=8, hidden=16)
    runs = [(n, pipesched.build_schedule(n, 2, 2), torch.float32, None) for n in ("1f1b", "zb-v", "interleaved-zb", "dualpipe")]
    runs.append(("zb-h1 clipped", pipesched.build_schedule("zb-h1", 2, 2), torch.float32, 0.05))
    runs.append(("dualpipe clipped", pipesched.build_schedule("dualpipe", 2, 2), torch.float32, 0.05))
    results = spawn(run_data_parallel, 4, ("mlp", size, 8, runs, 2), timeout_s=120)[0]
    places = results.pop("places")
    # pp is the inner mesh dimension: pipeline neighbours are consecutive global ranks
    assert places == [(0, 0, ((0, 1), (2, 3))), (1, 0, ((0, 1), (2, 3))), (0, 1, ((0, 1), (2, 3))), (1, 1, ((0, 1), (2, 3)))]
    # an infinite sample in replica 1's shard stops the step on every rank of both replicas
    assert results.pop("nonfinite") == [(True, True)] * 4
    clipped = {label: results.pop(label) for label in ("zb-h1 clipped", "dualpipe clipped")}
    assert_equal_to_reference(results, reference("mlp", size, 8))
    # clipping by the norm of the whole model over every rank, after the replicas averaged
    # (and, for dualpipe, after each pair of ranks summed its two model copies' gradients)
    assert_equal_to_reference(clipped, reference("mlp", size, 8, clip_grad_norm=0.05))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gpt_in_bf16_on_two_replicas_stays_within_one_percent_of_fp32():
    size = dict(layers=2, dim=16, heads=2, context=8)
    runs = [("zb-h1", pipesched.build_schedule("zb-h1", 2, 2), torch.float32, None),
            ("zb-h1 bf16", pipesched.build_schedule("zb-h1", 2, 2), torch.bfloat16, None)]
    results = spawn(run_data_parallel, 4, ("gpt", size, 8, runs, 2), timeout_s=120)[0]
    results.pop("places")
    ref = reference("gpt", size, 8)
    assert_equal_to_reference({"zb-h1": results["zb-h1"]}, ref)
    bf16 = results["zb-h1 bf16"]["losses"]
    assert all(torch.isfinite(torch.tensor(bf16)))
    assert bf16[-1] == pytest.approx(results["zb-h1"]["losses"][-1], rel=0.01)


def test_gradients_are_bucketed_in_order_up_to_the_byte_limit():
    grads = [torch.zeros(n) for n in (3, 2, 5, 1)]  # 12, 8, 20, 4 bytes
    assert [[g.numel() for g in b] for b in _buckets(grads, 20)] == [[3, 2], [5], [1]]


def test_split_backward_under_bf16_autocast_matches_autograd():
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    split = __import__("copy").deepcopy(plain)
    stash = WeightGradStash()
    make_weight_grads_deferrable(split, stash)
    x = torch.randn(6, 8)
    for model, deferred in ((plain, False), (split, True)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x).float().pow(2).mean()
        if deferred:
            stash.collecting = entries = []
        out.backward()
        stash.collecting = None
        if deferred:
            assert all(p.grad is None for p in model.parameters())  # I computed none of them
            apply_weight_grads(entries)
    for a, b in zip(plain.parameters(), split.parameters()):
        assert b.grad.dtype == torch.float32
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-2, atol=1e-3)


def _train(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    from conftest import cli_env

    return subprocess.run(
        [sys.executable, "-m", "pipesched", "train", "--steps", "1", *args],
        capture_output=True, text=True, timeout=120, env={**cli_env(), **(env or {})},
    )


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--dp", "0"], None, "--dp must be at least 1, got 0"),
        (["--ranks", "2", "--dp", "2", "--batch-size", "24"], None,
         "a batch of 24 does not split into 8 equal microbatches on each of its 2 data-parallel shares (--dp x --dp-shard): use a multiple of 16"),
        (["--ranks", "2", "--dp", "2"], {"RANK": "0", "WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
         "torchrun started 8 processes but --ranks 2 x --dp 2 needs 4"),
        (["--dtype", "fp16"], None, "--dtype 'fp16' is not known: use one of fp32, bf16"),
    ],
)
def test_bad_layouts_fail_in_one_line_before_any_rank_starts(args, env, message):
    done = _train(*args, env=env)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesched: error: ") and message in lines[0]


def test_each_replica_takes_its_contiguous_shard_of_the_global_batch():
    from pipesched.errors import ConfigError
    from pipesched.runtime.comm.mesh import PipelineMesh

    second = PipelineMesh(pp=2, dp=2, pp_rank=0, dp_rank=1, pp_group=None, dp_group=None, grid=((0, 1), (2, 3)))
    assert second.shard(torch.arange(8)).tolist() == [4, 5, 6, 7]
    assert second.global_rank(1) == 3
    with pytest.raises(ConfigError, match="does not split into 2 equal replica shards"):
        second.shard(torch.arange(5))


def test_a_run_carries_one_layout_that_places_ranks_as_the_pipeline_mesh_does():
    """``TrainConfig`` carries its processes' layout as one value, the one ``train``'s
    ``LayoutSection`` builds: the run's world and data ranks are the layout's, a layout of other
    pipeline ranks than the schedule's is refused, and its order is the runtime's, where global rank
    ``g`` is pipeline rank ``g % pp`` of replica ``g // pp`` (as ``init_pipeline_mesh`` places a
    ``--dp`` run's ranks)."""
    from pipesched.training.config.run_config import LayoutSection
    from pipesched.errors import ConfigError
    from pipesched.training.train import TrainConfig

    plan = pipesched.build_schedule("1f1b", 2, 4)
    cfg = TrainConfig("gpt", plan, 1, 48, layout=LayoutSection(ranks=2, dp=2, dp_shard=3, tp=2).of(plan.ranks))
    assert (cfg.world, cfg.data_ranks) == (2 * 2 * 3 * 2, 2 * 3)  # tp ranks read the same data
    assert TrainConfig("gpt", plan, 1, 8).layout == LayoutSection(ranks=2).of(plan.ranks)  # one replica
    replicas = LayoutSection(ranks=2, dp=2).of(plan.ranks)
    placed = [replicas.coordinates(g) for g in range(replicas.world)]
    assert [(c["dp_replicate"], c["pp"]) for c in placed] == [(g // 2, g % 2) for g in range(4)]
    with pytest.raises(ConfigError, match="has 3 pipeline ranks, the schedule 2"):
        TrainConfig("gpt", plan, 1, 8, layout=LayoutSection(ranks=3).of(3))


def test_auto_checks_the_replica_split_before_profiling():
    done = _train("--schedule", "auto", "--ranks", "2", "--dp", "2", "--batch-size", "24")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "pipesched: error: a batch of 24 does not split into 8 equal microbatches on each of its 2 data-parallel shares (--dp x --dp-shard): use a multiple of 16"
    ]


def test_the_run_summary_records_the_replicas_and_the_dtype():
    from pipesched.training.report.outputs import summary
    from pipesched.training.train import TrainResult

    result = TrainResult([1.0, 0.5], [0.1, 0.1], [], dp=2, dtype="bf16")
    got = summary(pipesched.build_schedule("zb-v", 2, 4), result)
    assert (got["ranks"], got["dp"], got["dtype"]) == (2, 2, "bf16")
