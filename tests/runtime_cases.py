"""Workers for the multi-process runtime tests (spawned processes import them by module name)."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn

from pipesched.runtime.copies import input_ranks, loss_ranks
from pipesched.runtime.executor import PipelineRuntime
from pipesched.runtime.models import get_model
from pipesched.runtime.train import TrainConfig, make_optimizer, train_reference

STEPS = 3


def relative_error(got: dict, want: dict) -> float:
    """Largest over tensors of max|got - want| / max|want|."""
    assert got.keys() == want.keys()
    return max(float((got[k] - want[k]).abs().max() / want[k].abs().max().clamp_min(1e-30)) for k in want)


def assert_equal_to_reference(results: dict, ref: dict, tol: float = 1e-5) -> None:
    """Each labelled run's first loss, first-step gradients and final parameters equal ``ref``'s
    within ``tol`` relative."""
    import pytest

    for label, got in results.items():
        assert got["losses"][0] == pytest.approx(ref["loss"], rel=tol), label
        assert relative_error(got["grads"], ref["grads"]) < tol, label
        assert relative_error(got["params"], ref["params"]) < tol, label


def reference(model: str, size: dict, batch: int, seed: int = 3, clip_grad_norm=None, optimizer="sgd") -> dict:
    cfg = TrainConfig(model, None, STEPS, batch, seed=seed, model_size=size, want_params=True, want_grads=True,
                      clip_grad_norm=clip_grad_norm, optimizer=optimizer)
    res = train_reference(cfg)
    return {"loss": res.losses[0], "grads": res.grads, "params": res.params}


def run_schedules(rank: int, world: int, job: tuple) -> dict:
    """Train every (label, schedule) of ``job`` for STEPS steps; rank 0 returns loss, grads, params.
    A label ending in ``host-staged`` passes its messages through separate host buffers (as ranks
    on GPUs over gloo do)."""
    model, size, batch, schedules, *rest = job
    clip_grad_norm, optimizer, recompute = (rest + [None, "sgd", None][len(rest):])[:3]
    md = get_model(model, **size)
    out = {}
    for label, schedule in schedules:
        torch.manual_seed(1234 + rank)  # different global RNG per rank: seeding per block must not care
        x0, _ = md.batch(0, batch, 3)
        rt = PipelineRuntime(
            md.build_block, md.num_blocks, schedule, md.loss_fn, make_optimizer(optimizer, 0.05),
            x0[: batch // schedule.microbatches], seed=3, timeout_s=60,
            host_staging=label.endswith("host-staged"), clip_grad_norm=clip_grad_norm, recompute=recompute,
        )
        losses, grads = [], None
        for step in range(STEPS):
            x, y = md.batch(step, batch, 3)
            losses.append(rt.step(x if rank in input_ranks(schedule) else None, y if rank in loss_ranks(schedule) else None).loss)
            if step == 0:
                grads = rt.gather_gradients()
        params = rt.gather_state_dict()
        out[label] = {"losses": losses, "grads": grads, "params": params}
    return out


def measure_memory(rank: int, world: int, job: tuple) -> dict:
    """For each (label, schedule, recompute): every rank's most activation bytes measured over
    STEPS steps and the prediction from the first step's sizes, gathered on rank 0."""
    import torch.distributed as dist

    model, size, batch, runs = job
    md = get_model(model, **size)
    out = {}
    for label, schedule, recompute in runs:
        x0, _ = md.batch(0, batch, 3)
        rt = PipelineRuntime(md.build_block, md.num_blocks, schedule, md.loss_fn, make_optimizer("sgd", 0.05),
                             x0[: batch // schedule.microbatches], seed=3, timeout_s=60, recompute=recompute)
        measured = max(rt.step(*md.batch(step, batch, 3)).peak_activation_bytes for step in range(STEPS))
        parts = [None] * world
        dist.all_gather_object(parts, (measured, rt.predicted_peak_activation_bytes(), rt.meter.current))
        out[label] = parts
    return out


class Saboteur(nn.Module):
    """A block that, on rank 1, kills its process, raises (noting when in the file
    $PIPESCHED_TEST_RAISED_AT) or hangs at one forward of the second step."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.calls = 0
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        self.calls += 1
        if int(os.environ.get("RANK", "-1")) == 1 and self.calls == 6:
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.mode == "raise":
                with open(os.environ["PIPESCHED_TEST_RAISED_AT"], "w") as fh:
                    fh.write(str(time.time()))
                raise RuntimeError("a bug in rank 1's block")
            time.sleep(3600)
        return self.lin(x)


def faulty_run(rank: int, world: int, job: tuple) -> None:
    schedule, mode, timeout_s = job
    os.environ["RANK"] = str(rank)
    loss = nn.functional.mse_loss
    rt = PipelineRuntime(
        lambda i: Saboteur(mode), 4, schedule, loss, lambda ps: torch.optim.SGD(ps, lr=0.1),
        torch.zeros(2, 8), timeout_s=timeout_s,
    )
    for _ in range(4):
        rt.step(torch.randn(8, 8), torch.randn(8, 8))


def nonfinite_run(rank: int, world: int, job: tuple) -> list:
    schedule, skip = job
    md = get_model("mlp", blocks=3, dim=8, hidden=16)
    x, y = md.batch(0, 8, 0)
    x[5] = float("inf")  # microbatch 2 of 4 (two samples each)
    rt = PipelineRuntime(
        md.build_block, md.num_blocks, schedule, md.loss_fn, lambda ps: torch.optim.SGD(ps, lr=0.1),
        x[:2], timeout_s=60, skip_nonfinite=skip,
    )
    before = [p.detach().clone() for p in rt.parameters]
    result = rt.step(x, y)
    unchanged = all(torch.equal(a, p) for a, p in zip(before, rt.parameters))
    return [result.skipped, unchanged]


def rank_setup(rank: int, world: int, _job) -> tuple[int, bool]:
    """What a spawned rank runs with: its compute threads and whether freed memory is kept."""
    from pipesched.runtime import launch

    return torch.get_num_threads(), launch.memory_kept


class StridedOutput(nn.Module):
    """A Linear whose output is a non-contiguous view (as a block ending in a transpose is)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        return torch.tanh(self.lin(x)).t().contiguous().t()


def strided_blocks(i: int) -> nn.Module:
    return StridedOutput(8)


def strided_run(rank: int, world: int, job) -> list:
    """Two steps of ``job``'s schedule over StridedOutput blocks; the losses."""
    schedule, batch = job
    x, y = torch.randn(batch, 8, generator=torch.Generator().manual_seed(0)), torch.zeros(batch, 8)
    rt = PipelineRuntime(strided_blocks, 4, schedule, nn.functional.mse_loss,
                         lambda ps: torch.optim.SGD(ps, lr=0.1), x[: batch // schedule.microbatches], seed=5)
    return [rt.step(x, y).loss for _ in range(2)]


def id_passthrough_blocks(i: int) -> nn.Module:
    """Block 0 passes token ids on unchanged; block 1 embeds them; then Linears."""
    return nn.Identity() if i == 0 else nn.Embedding(10, 8) if i == 1 else nn.Linear(8, 8)


def integer_boundary_run(rank: int, world: int, schedule) -> None:
    ids = torch.zeros(4, 3, dtype=torch.long)
    PipelineRuntime(id_passthrough_blocks, 4, schedule, nn.functional.mse_loss,
                    lambda ps: torch.optim.SGD(ps, lr=0.1), ids[:2], block_counts=[1, 3])


def staging_decision(rank: int, world: int, _job) -> bool:
    """Whether a rank's transport would stage messages through host memory for a device other
    than the CPU, over gloo (on 3 ranks a rank is not a member of every link group)."""
    import pipesched
    from pipesched.runtime.p2p import Transport, make_link_groups
    from pipesched.runtime.plan import ACT, GRAD, links, plan_rank

    schedule = pipesched.build_schedule("1f1b", world, 2)
    groups = make_link_groups(links(schedule), 30)
    shapes = {(kind, s): (torch.Size([1]), torch.float32) for kind in (ACT, GRAD) for s in range(world)}
    return Transport(plan_rank(schedule, rank), groups, shapes, torch.device("meta"), 30).host_staging


def nonfinite_weights_run(rank: int, world: int, schedule) -> None:
    """One step with a NaN learning rate: every parameter becomes NaN after the optimizer step."""
    md = get_model("mlp", blocks=3, dim=8, hidden=16)
    x, y = md.batch(0, 8, 0)
    rt = PipelineRuntime(md.build_block, md.num_blocks, schedule, md.loss_fn,
                         lambda ps: torch.optim.SGD(ps, lr=float("nan")), x[:2], timeout_s=60)
    rt.step(x, y)


CHECKPOINT_MODEL = {"blocks": 3, "dim": 8, "hidden": 16}


def checkpoint_crash_run(rank: int, world: int, job: tuple) -> None:
    """Two AdamW steps of a small MLP, checkpointed after each; rank 1 is killed (SIGKILL) in the
    middle of writing the second checkpoint, after its data file and before the metadata."""
    import torch.distributed.checkpoint as dcp

    from pipesched.runtime import checkpoint

    directory, schedule = job
    md = get_model("mlp", **CHECKPOINT_MODEL)
    rt = PipelineRuntime(md.build_block, md.num_blocks, schedule, md.loss_fn, make_optimizer("adamw", 0.01),
                         md.batch(0, 8, 0)[0][:2], timeout_s=60)
    rt.step(*md.batch(0, 8, 0))
    checkpoint.save_runtime(rt, directory)
    rt.step(*md.batch(1, 8, 0))
    if rank == 1:
        write_data = dcp.FileSystemWriter.write_data

        def write_then_die(self, plan, planner):
            write_data(self, plan, planner).wait()
            os.kill(os.getpid(), signal.SIGKILL)

        dcp.FileSystemWriter.write_data = write_then_die
    checkpoint.save_runtime(rt, directory)


def run_data_parallel(rank: int, world: int, job: tuple) -> dict:
    """Each (label, schedule, dtype, clip_grad_norm) of ``job`` on ``dp`` replicas of its pipeline
    (a 2D mesh of the world) for STEPS steps on the global batch; rank 0 returns losses,
    first-step grads and params, every rank's place on the mesh, and, after one more step of the
    last runtime on a batch with an infinite sample, whether each rank skipped it unchanged."""
    from pipesched.runtime.mesh import init_pipeline_mesh

    model, size, batch, runs, dp = job
    md = get_model(model, **size)
    out = {}
    for label, schedule, dtype, clip in runs:
        mesh = init_pipeline_mesh(schedule.ranks, dp)
        x0, _ = md.batch(0, batch, 3)
        rt = PipelineRuntime(
            md.build_block, md.num_blocks, schedule, md.loss_fn, make_optimizer("sgd", 0.05),
            x0[: batch // (dp * schedule.microbatches)], seed=3, timeout_s=60, mesh=mesh, dtype=dtype,
            clip_grad_norm=clip, skip_nonfinite=True,
        )
        losses, grads = [], None
        for step in range(STEPS):
            x, y = md.batch(step, batch, 3)
            first, last = mesh.pp_rank in input_ranks(schedule), mesh.pp_rank in loss_ranks(schedule)
            losses.append(rt.step(x if first else None, y if last else None).loss)
            if step == 0:
                grads = rt.gather_gradients()
        out[label] = {"losses": losses, "grads": grads, "params": rt.gather_state_dict()}
    places = [None] * world
    torch.distributed.all_gather_object(places, (mesh.pp_rank, mesh.dp_rank, mesh.grid))
    out["places"] = places
    if x.is_floating_point():  # poison one sample of the last replica's shard
        x[-1] = float("inf")
        before = [p.detach().clone() for p in rt.parameters]
        skipped = rt.step(x, y).skipped
        unchanged = all(torch.equal(a, p) for a, p in zip(before, rt.parameters))
        verdicts = [None] * world
        torch.distributed.all_gather_object(verdicts, (skipped, unchanged))
        out["nonfinite"] = verdicts
    return out


def copies_checkpoint_run(rank: int, world: int, job: tuple) -> tuple:
    """``job``'s schedule (dualpipe: two model copies) with AdamW: four steps straight, and two
    steps checkpointed then a fresh runtime resumed from that checkpoint for the other two.
    Returns every rank's parameters after each (unpipelined names), gathered everywhere."""
    import torch.distributed as dist

    from pipesched.runtime import checkpoint

    directory, schedule = job
    md = get_model("mlp", **CHECKPOINT_MODEL)

    def fresh() -> PipelineRuntime:
        return PipelineRuntime(md.build_block, md.num_blocks, schedule, md.loss_fn, make_optimizer("adamw", 0.01),
                               md.batch(0, 8, 0)[0][: 8 // schedule.microbatches], timeout_s=60)

    whole = fresh()
    for step in range(4):
        whole.step(*md.batch(step, 8, 0))
    saved = fresh()
    for step in range(2):
        saved.step(*md.batch(step, 8, 0))
    checkpoint.save_runtime(saved, directory)
    resumed = fresh()
    checkpoint.load_runtime(resumed, checkpoint.latest(directory))
    for step in range(2, 4):
        resumed.step(*md.batch(step, 8, 0))
    out = []
    for rt in (whole, resumed):
        parts = [None] * world
        dist.all_gather_object(parts, {n: p.detach().clone() for n, p in rt.named_parameters()})
        out.append(parts)
    return tuple(out)


class PairBlock(nn.Module):
    """A block that returns a tuple (what the runtime cannot send between stages)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x), x


def misuse_run(rank: int, world: int, schedule) -> list:
    """Every misuse the runtime must refuse on every rank alike (one line each, nothing hung):
    arguments that differ across ranks, a block returning a tuple, a batch shaped unlike
    ``sample_input`` on one rank, a loss that is not a scalar; then a rank that never starts its
    step under a short ``timeout_s`` (the default group waits 120 s). Returns what each case
    raised on this rank, and how long the last one waited."""
    import torch.distributed as dist

    from pipesched.errors import ConfigError

    md = get_model("mlp", blocks=3, dim=8, hidden=16)
    x, y = md.batch(0, 8, 0)
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731

    def build(blocks=md.build_block, loss=md.loss_fn, **options):
        return PipelineRuntime(blocks, md.num_blocks, schedule, loss, sgd, x[:2], **{"timeout_s": 60, **options})

    said = []

    def attempt(case) -> None:
        try:
            case()
            said.append(None)
        except ConfigError as err:
            said.append(str(err))

    attempt(lambda: build(block_counts=(2, 2) if rank == 0 else (3, 1)))
    attempt(lambda: build(seed=rank))
    attempt(lambda: build(blocks=lambda i: PairBlock() if i == 1 else nn.Linear(8, 8)))  # block 1 ends stage 0
    runtime = build()
    wide = torch.zeros(8, 16)
    attempt(lambda: runtime.step(wide if rank == 0 else x, y))
    attempt(lambda: build(loss=lambda out, target: (out - target) ** 2).step(x, y))
    runtime.step(x, y)  # the runtime still works after refusing a bad step
    short = build(timeout_s=3)
    dist.barrier()
    if rank == 1:
        time.sleep(8)  # never starts the step: its peer must give up after 3 s, not 120
        return said
    t0 = time.monotonic()
    try:
        short.step(x, y)
    except RuntimeError as err:  # PeerFailure
        said.append(str(err))
    return [said, time.monotonic() - t0]
