"""Sharded stages in the pipeline: every single-pipeline schedule family, each stage split by FSDP2
(pp 2 x dp_shard 2) or by tensor parallelism (pp 2 x tp 2), trains the gpt as the unpipelined model.

The runtime shards each stage (``PipelineRuntime(..., mesh=init_sharded_mesh(layout))``): the
program's ``UNSHARD``/``RESHARD`` gather and free the stage's parameters, every backward runs with
gradient sync off, ``REDUCE_GRAD`` reduce-scatters (SUM) and divides once by the data-parallel
degree (the runner already scaled each microbatch's loss by ``1/m``). Loss, first-step gradients
and the weights after the SGD steps, gathered whole, within 1e-5 relative of the one-process model:
what differs is the order of fp32 sums (microbatches, shards, the row-parallel all-reduce), a few
ulps on sums of at most a few hundred terms. Every step of every case all-gathers a stage
exactly where its program's ``UNSHARD``s say (FSDP's own hooks gather nothing more); one more
case runs interleaved-1f1b as a ``compute_comms`` CSV whose gathers ``plan_programs`` placed
within one stage a rank (each stage freed and gathered again within a step), the CSV's placement
run as written. One 4-process launch runs every case.
"""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from runtime_cases import assert_equal_to_reference, reference  # noqa: E402

import pipesched  # noqa: E402
from pipesched.ops import Op  # noqa: E402
from pipesched.runtime.launching.launch import spawn  # noqa: E402
from pipesched.runtime.program.planned_gathers import GatherCosts, plan_programs  # noqa: E402
from pipesched.runtime.program.program import lower_all  # noqa: E402
from pipesched.schedule_files import csv_text, parse_csv  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]
SIZE = dict(layers=2, dim=16, heads=4, context=8)  # 4 blocks: one per stage at 2 ranks x 2 chunks
BATCH, MICROBATCHES = 8, 4
LAYOUTS = {"dp_shard 2": (1, 2, 1), "tp 2": (1, 1, 2)}  # (dp_replicate, dp_shard, tp)
SINGLE_PIPELINE = [f.name for f in pipesched.families() if f.parameter_copies == 1]
PLANNED = "interleaved-1f1b planned gathers dp_shard 2"


def _assert_gathered_where_the_programs_say(results: dict, placed: Counter, windowed: Counter) -> None:
    """FSDP all-gathers a stage's groups exactly where the program's UNSHARDs say, in every step
    of every case; the planned case gathers as its CSV says (some stage freed and gathered again
    within a step), not as the lowering's window of 3 would (each stage once a step)."""
    for label, got in results.items():
        seen = [stages for rank in got.pop("gathered") for stages in rank]
        for unshards, gathers, groups in (counts for stages in seen for counts in stages.values()):
            assert gathers == unshards * groups and (unshards * groups > 0 or "dp_shard" not in label), (label, seen)
        if label == PLANNED:
            assert all({s: unshards for s, (unshards, _, _) in stages.items()} == {s: placed[s] for s in stages}
                       for stages in seen), seen
    assert max(placed.values()) > 1 and max(windowed.values()) == 1


def _planned_gathers_from_csv():
    """interleaved-1f1b (2 stages a rank) gathering as ``export --format compute_comms
    --gather-plan auto --gather-time 1 --gather-limit 1`` places it, read back from that CSV; and
    the UNSHARDs per stage in a step of that plan and of the lowering's window of 3."""
    schedule = pipesched.build_schedule("interleaved-1f1b", 2, MICROBATCHES)
    each = {s: 1.0 for s in range(schedule.stages)}
    chosen = plan_programs(schedule, GatherCosts(each, each, limit=1), plan="auto")
    planned = parse_csv(csv_text(schedule, "compute_comms", chosen.programs))
    return planned, _unshards(chosen.programs), _unshards(lower_all(schedule))


def _unshards(programs) -> Counter:
    return Counter(ins.stage for program in programs for ins in program.instructions if ins.op is Op.UNSHARD)


@pytest.mark.timeout(300)
def test_every_single_pipeline_family_trains_sharded_stages_as_the_unpipelined_model():
    from gather_counts import counting_gathers
    from sharded_cases import pipelined_layouts

    runs = [(f"{name} {where}", pipesched.build_schedule(name, 2, MICROBATCHES), dims)
            for name in SINGLE_PIPELINE for where, dims in LAYOUTS.items()]
    planned, placed, windowed = _planned_gathers_from_csv()
    runs.append((PLANNED, planned, LAYOUTS["dp_shard 2"]))
    from advised_bytes import advised_state_bytes

    from pipesched.balance import even_counts
    from pipesched.runtime.sharding.sharded_mesh import runtime_layout

    results = spawn(counting_gathers, 4, (pipelined_layouts, (SIZE, BATCH, runs), [label for label, *_ in runs]),
                    timeout_s=240)[0]
    assert set(results) == {label for label, _, _ in runs}
    # every rank holds the parameter, gradient and optimizer bytes the layout predicts from the
    # stages' shapes, and the advisor from the gpt's sizes (SGD: no optimizer state)
    for label, schedule, (replicas, shards, tp) in runs:
        layout, counts = runtime_layout(2, replicas, shards, tp), even_counts(SIZE["layers"] + 2, schedule.stages)
        for rank, got in enumerate(results[label].pop("state_bytes")):
            assert got["measured"] == got["predicted"], (label, rank, got)
            assert got["measured"] == advised_state_bytes(SIZE, layout, schedule.placement, counts, rank, 0), (label, rank)
    _assert_gathered_where_the_programs_say(results, placed, windowed)
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
