"""The engine on its own: every rank's program runs in one process, no torch.distributed.

Each rank's engine is built from its parts (its lowered program, a StageRunner per owned stage,
an in-memory transport, a meter and a stash), as PipelineRuntime builds it, and the ranks run in
threads of this process (pipesched.runtime.engine.local_transport). One step of zb-v on 2 ranks (a V: the
turn of the V hands over in memory, the split backward defers every Linear's weight gradient to
W) and of dualpipev (overlapped pairs) must give the unpipelined model's loss and gradients. The
same operations in the same order per microbatch; the sums over microbatches are the only
reordering (m partial sums added in fp32 instead of one batch matmul), so 1e-6 relative.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import pipesched  # noqa: E402
from pipesched.runtime.engine.engine import Engine, StepBatch  # noqa: E402
from pipesched.runtime.engine.local_transport import LocalLinks, run_engines  # noqa: E402
from pipesched.runtime.engine.shapes import ShapeBook, infer_boundary_shapes  # noqa: E402
from pipesched.runtime.engine.split_backward import (  # noqa: E402
    WeightGradStash,
    make_weight_grads_deferrable,
)
from pipesched.runtime.engine.stage_runner import build_runners  # noqa: E402
from pipesched.runtime.metering.memory_meter import ActivationMeter  # noqa: E402
from pipesched.runtime.metering.observers import make_clock  # noqa: E402
from pipesched.runtime.program.program import lower  # noqa: E402
from pipesched.runtime.stages.copies import ModelCopies  # noqa: E402
from pipesched.runtime.stages.partition import (  # noqa: E402
    build_block_seeded,
    build_stage,
    stage_block_ranges,
)
from pipesched.runtime.stages.precision import Precision  # noqa: E402

pytestmark = pytest.mark.torch
BLOCKS, WIDTH, BATCH, SEED = 8, 8, 8, 3


def block(index: int) -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())


def rank_engines(schedule) -> tuple[list[Engine], list[dict]]:
    """Every rank's engine and its stages (schedule stage -> module), on one shared set of links."""
    copies = ModelCopies(schedule)
    model_ranges = stage_block_ranges(BLOCKS, copies.length)
    ranges = copies.stage_ranges(model_ranges)
    sample = torch.zeros(BATCH // schedule.microbatches, WIDTH)
    links, precision = LocalLinks(timeout_s=30), Precision(torch.float32, "cpu")
    engines, stages_of = [], []
    for rank in range(schedule.ranks):
        stages = {s: build_stage(block, ranges[s], s, SEED, torch.device("cpu"))
                  for s, r in enumerate(schedule.placement) if r == rank}
        meter = ActivationMeter(exclude=[p for st in stages.values() for p in st.parameters()])
        stash = WeightGradStash(hold=meter.hold)
        if schedule.split_backward:
            for stage in stages.values():
                make_weight_grads_deferrable(stage, stash)
        shapes = ShapeBook(lambda x, ctx: infer_boundary_shapes(block, model_ranges, x, ctx, seed=SEED),
                           schedule, copies, precision.wire_dtype, sample, None)
        runners = build_runners(stages, copies, nn.functional.mse_loss, schedule.microbatches, shapes=shapes,
                                precision=precision, meter=meter, stash=stash)
        engines.append(Engine(lower(schedule, rank), runners, links.transport(rank), precision=precision, meter=meter))
        stages_of.append(stages)
    return engines, stages_of


def one_step_in_process(schedule, x: torch.Tensor, y: torch.Tensor) -> tuple[float, dict]:
    engines, stages_of = rank_engines(schedule)
    copies = ModelCopies(schedule)
    m = schedule.microbatches
    batches = [StepBatch(x.chunk(m) if any(map(copies.takes_inputs, st)) else None,
                         y.chunk(m) if any(map(copies.computes_loss, st)) else None) for st in stages_of]
    results = run_engines(engines, batches, m, [make_clock(torch.device("cpu"), None) for _ in engines])
    losses = [loss for rank_losses, _marks in results for loss in rank_losses if loss is not None]
    grads: dict = {}
    for stages in stages_of:
        for stage in stages.values():
            for name, p in stage.global_named_parameters():  # DualPipe's two copies of a stage: their sum
                grads[name] = grads[name] + p.grad if name in grads else p.grad.clone()
    return sum(float(v) for v in losses) / m, grads


def unpipelined(x: torch.Tensor, y: torch.Tensor) -> tuple[float, dict]:
    model = nn.Sequential(*(build_block_seeded(block, i, SEED) for i in range(BLOCKS)))
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["zb-v", "dualpipev", "interleaved-zb"])
def test_every_ranks_engine_in_one_process_trains_as_the_unpipelined_model(name):
    schedule = pipesched.build_schedule(name, 2, 4)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)
    loss, grads = one_step_in_process(schedule, x, y)
    want_loss, want = unpipelined(x, y)
    assert loss == pytest.approx(want_loss, rel=1e-6)
    assert grads.keys() == want.keys()
    for key in want:
        assert torch.allclose(grads[key], want[key], rtol=1e-6, atol=1e-7), key


def test_the_engine_has_one_handler_per_instruction_and_gathers_are_no_ops_on_whole_stages():
    from pipesched.ops import Op

    engines, _ = rank_engines(pipesched.build_schedule("zb-v", 2, 4))
    assert set(engines[0].handlers) == set(Op)
    program = engines[0].program
    assert {i.op for i in program.instructions} >= {Op.UNSHARD, Op.RESHARD, Op.REDUCE_GRAD, Op.SEND_F, Op.RECV_B}
