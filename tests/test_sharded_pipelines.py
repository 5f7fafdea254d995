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

from runtime_cases import assert_equal_to_reference, reference  # noqa: E402

import pipesched  # noqa: E402
from pipesched.runtime.launching.launch import spawn  # noqa: E402

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
    from advised_bytes import advised_state_bytes

    from pipesched.balance import even_counts
    from pipesched.runtime.sharding.sharded_mesh import runtime_layout

    results = spawn(pipelined_layouts, 4, (SIZE, BATCH, runs), timeout_s=240)[0]
    assert set(results) == {label for label, _, _ in runs}
    # every rank holds the parameter, gradient and optimizer bytes the layout predicts from the
    # stages' shapes, and the advisor from the gpt's sizes (SGD: no optimizer state)
    for label, schedule, (replicas, shards, tp) in runs:
        layout, counts = runtime_layout(2, replicas, shards, tp), even_counts(SIZE["layers"] + 2, schedule.stages)
        for rank, got in enumerate(results[label].pop("state_bytes")):
            assert got["measured"] == got["predicted"], (label, rank, got)
            assert got["measured"] == advised_state_bytes(SIZE, layout, schedule.placement, counts, rank, 0), (label, rank)
    assert_equal_to_reference(results, reference("gpt", SIZE, BATCH))


def _hf_reference(kind: str, batches: list) -> dict:
    """The one-process Hugging Face model, fp32, SGD, on the whole batches: the first loss and
    gradients (every name, a tied weight under each), the final weights."""
    from hf_cases import make_model
    from sharded_cases import LR

    model = make_model(kind, torch.float32)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads = [], None
    for step, batch in enumerate(batches):
        optimizer.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters(remove_duplicate=False)}
        optimizer.step()
    return {"loss": losses[0], "grads": grads, "params": {k: v.clone() for k, v in model.state_dict().items()}}


@pytest.mark.timeout(300)
def test_hugging_face_llama_and_tied_gpt2_train_sharded_stages_as_the_model_in_one_process():
    """Llama under zb-v (a V, its weight gradients deferred to W), GPT-2 (its head the token
    embedding, tied across the two ranks) under 1f1b, each at pp 2 x dp_shard 2 and pp 2 x tp 2
    (GPT-2's attention stays whole under tensor parallelism, its MLP splits); 1e-5 relative as above."""
    from hf_cases import make_batch
    from sharded_cases import hf_pipelined_layouts

    batches = [make_batch(step, 8, 16) for step in range(2)]
    runs = [(f"{kind} {name} {where}", kind, pipesched.build_schedule(name, 2, 2), dims)
            for kind, names in (("llama", ("zb-v",)), ("gpt2", ("1f1b",)))
            for name in names for where, dims in LAYOUTS.items()]
    results = spawn(hf_pipelined_layouts, 4, (runs, batches), timeout_s=240)[0]
    for kind in ("llama", "gpt2"):
        assert_equal_to_reference({k: v for k, v in results.items() if k.startswith(kind)}, _hf_reference(kind, batches))
