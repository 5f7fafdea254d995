"""Sharded stages in the pipeline: every single-pipeline schedule family, each stage split by FSDP2
(pp 2 x dp_shard 2) or by tensor parallelism (pp 2 x tp 2), trains the gpt as the unpipelined model.

The runtime shards each stage (``PipelineRuntime(..., mesh=init_sharded_mesh(layout))``): the
program's ``UNSHARD``/``RESHARD`` gather and free the stage's parameters, every backward runs with
gradient sync off, ``REDUCE_GRAD`` reduce-scatters (SUM) and divides once by the data-parallel
degree (the runner already scaled each microbatch's loss by ``1/m``). Loss, first-step gradients
and the weights after the SGD steps, gathered whole, within 1e-5 relative of the one-process model:
what differs is the order of fp32 sums (microbatches, shards, the row-parallel all-reduce), a few
ulps on sums of at most a few hundred terms. One 4-process launch runs every case.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import pipesched  # noqa: E402
from pipesched.runtime.launch import spawn  # noqa: E402
from runtime_cases import assert_equal_to_reference, reference  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]
SIZE = dict(layers=2, dim=16, heads=4, context=8)  # 4 blocks: one per stage at 2 ranks x 2 chunks
BATCH, MICROBATCHES = 8, 4
LAYOUTS = {"dp_shard 2": (1, 2, 1), "tp 2": (1, 1, 2)}  # (dp_replicate, dp_shard, tp)
SINGLE_PIPELINE = [f.name for f in pipesched.families() if f.parameter_copies == 1]


@pytest.mark.timeout(300)
def test_every_single_pipeline_family_trains_sharded_stages_as_the_unpipelined_model():
    from sharded_cases import pipelined_layouts

    runs = [(f"{name} {where}", pipesched.build_schedule(name, 2, MICROBATCHES), dims)
            for name in SINGLE_PIPELINE for where, dims in LAYOUTS.items()]
    results = spawn(pipelined_layouts, 4, (SIZE, BATCH, runs), timeout_s=240)[0]
    assert set(results) == {label for label, _, _ in runs}
    # every rank holds the parameter, gradient and optimizer bytes the layout predicts (SGD: none)
    for label, got in results.items():
        for rank in got.pop("state_bytes"):
            assert rank["measured"] == rank["predicted"], (label, rank)
    assert_equal_to_reference(results, reference("gpt", SIZE, BATCH))
