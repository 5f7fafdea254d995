"""Workers for the multi-process runtime tests (spawned processes import them by module name)."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn

from pipesched.runtime.checkpoints import checkpoint
from pipesched.runtime.executor import PipelineRuntime, RuntimeOptions
from pipesched.runtime.stages.staged_model import StagedModel
from pipesched.runtime.stages.copies import input_ranks, loss_ranks
from pipesched.training.models import get_model
from pipesched.training.train import (
    TrainConfig,
    make_optimizer,
    train_reference,
)

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


def adamw_rounding(steps: list[tuple[dict, dict]], name: str) -> tuple[float, torch.Tensor]:
    """For parameter ``name``, given each step's (fp32, float64) gradients of the model in one
    process: fp32's largest rounding of its gradient, and every step's exact gradient sizes."""
    rounding = max(float((fp32[name] - fp64[name]).abs().max()) for fp32, fp64 in steps)
    return rounding, torch.stack([fp64[name].abs() for _, fp64 in steps])


def adamw_allowed(weight: torch.Tensor, rounding: float, sizes: torch.Tensor, lr: float) -> torch.Tensor:
    """How far AdamW's weights may land from the fp32 model's in one process after ``len(sizes)``
    steps, per element: 1e-5 relative, plus what AdamW makes of a gradient's rounding. Its step
    ``lr * m / (sqrt(v) + eps)`` weighs an element's gradient against its own size, so an element
    whose exact gradient ``g`` (the smallest over the steps) is near the rounding ``n`` may step up
    to ``lr * n / |g|`` differently each step, and one whose exact gradient is zero up to ``lr`` in
    a direction rounding picks; no other summation order can match the model's there."""
    return 1e-5 * weight.abs().max() + len(sizes) * lr * (rounding / sizes.amin(0)).clamp(max=1)


def stepwise_reference(model: str, size: dict, batch: int, optimizer: str, lr: float, dtype: torch.dtype,
                       seed: int = 3, steps: int = STEPS) -> dict:
    """The unpipelined ``model`` in ``dtype`` (float64: exact, to fp32's eyes) trained as
    :func:`reference` trains it: every loss, every step's gradients, the final weights."""
    md = get_model(model, **size)
    net = md.sequential(seed).to(dtype)
    opt = make_optimizer(optimizer, lr)(list(net.parameters()))
    losses, step_grads = [], []
    for step in range(steps):
        x, y = md.batch(step, batch, seed)
        opt.zero_grad(set_to_none=True)
        loss = md.loss_fn(net(x), y)
        loss.backward()
        losses.append(loss.item())
        step_grads.append({n: p.grad.detach().clone() for n, p in net.named_parameters()})
        opt.step()
    return {"losses": losses, "step_grads": step_grads, "params": {k: v.detach().clone() for k, v in net.state_dict().items()}}


def reference(model: str, size: dict, batch: int, seed: int = 3, clip_grad_norm=None, optimizer="sgd",
              steps: int = STEPS) -> dict:
    cfg = TrainConfig(model, None, steps, batch, RuntimeOptions(seed=seed, clip_grad_norm=clip_grad_norm),
                      model_size=size, want_params=True, want_grads=True, optimizer=optimizer)
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
            StagedModel(md.build_block, md.num_blocks, x0[: batch // schedule.microbatches]),
            schedule, md.loss_fn, make_optimizer(optimizer, 0.05),
            options=RuntimeOptions(seed=3, timeout_s=60, host_staging=label.endswith("host-staged"),
                                   clip_grad_norm=clip_grad_norm, recompute=recompute),
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
        rt = PipelineRuntime(StagedModel(md.build_block, md.num_blocks, x0[: batch // schedule.microbatches]),
                             schedule, md.loss_fn, make_optimizer("sgd", 0.05),
                             options=RuntimeOptions(seed=3, timeout_s=60, recompute=recompute, meter_every_step=True))
        measured = max(rt.step(*md.batch(step, batch, 3)).peak_activation_bytes for step in range(STEPS))
        parts = [None] * world
        dist.all_gather_object(parts, (measured, rt.predicted_peak_activation_bytes(), rt.meter.current))
        out[label] = parts
    return out


def metered_steps(rank: int, world: int, job: tuple) -> list:
    """Which of four steps (two of one batch shape, two of another) the meter counted, by
    default: their peak activation bytes, None where not counted."""
    schedule, size = job
    md = get_model("mlp", **size)
    x0, _ = md.batch(0, 8, 3)
    rt = PipelineRuntime(StagedModel(md.build_block, md.num_blocks, x0[: 8 // schedule.microbatches]),
                         schedule, md.loss_fn, make_optimizer("sgd", 0.05),
                         options=RuntimeOptions(seed=3, timeout_s=60))
    return [rt.step(*md.batch(step, size, 3)).peak_activation_bytes for step, size in enumerate((8, 8, 16, 16))]


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
        StagedModel(lambda i: Saboteur(mode), 4, torch.zeros(2, 8)),
        schedule, loss, lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=RuntimeOptions(timeout_s=timeout_s),
    )
    for _ in range(4):
        rt.step(torch.randn(8, 8), torch.randn(8, 8))


def nonfinite_run(rank: int, world: int, job: tuple) -> list:
    schedule, skip = job
    md = get_model("mlp", blocks=3, dim=8, hidden=16)
    x, y = md.batch(0, 8, 0)
    x[5] = float("inf")  # microbatch 2 of 4 (two samples each)
    rt = PipelineRuntime(
        StagedModel(md.build_block, md.num_blocks, x[:2]),
        schedule, md.loss_fn, lambda ps: torch.optim.SGD(ps, lr=0.1),
        options=RuntimeOptions(timeout_s=60, skip_nonfinite=skip),
    )
    before = [p.detach().clone() for p in rt.parameters]
    result = rt.step(x, y)
    unchanged = all(torch.equal(a, p) for a, p in zip(before, rt.parameters))
    return [result.skipped, unchanged]


def rank_setup(rank: int, world: int, _job) -> tuple[int, bool, str]:
    """What a spawned rank runs with: its compute threads, whether freed memory is kept, and the
    store it joined."""
    import os

    from pipesched.runtime.launching import launch

    return torch.get_num_threads(), launch.memory_kept, os.environ["MASTER_PORT"]


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
    rt = PipelineRuntime(StagedModel(strided_blocks, 4, x[: batch // schedule.microbatches]),
                         schedule, nn.functional.mse_loss, lambda ps: torch.optim.SGD(ps, lr=0.1),
                         options=RuntimeOptions(seed=5))
    return [rt.step(x, y).loss for _ in range(2)]


class IdsAlongside(nn.Module):
    """Block ``i`` of a model whose stages pass ``(hidden state, token ids)``: block 0 embeds the
    ids; each later block adds an embedding of the ids (an integer entry crossing every stage
    boundary, which never gets a gradient) to a Linear of the hidden state; the last is the head."""

    def __init__(self, i: int, last: int) -> None:
        super().__init__()
        self.i, self.last = i, last
        self.emb = nn.Embedding(10, 8)
        if i > 0:
            self.lin = nn.Linear(8, 10 if i == last else 8)

    def forward(self, value):
        if self.i == 0:
            return torch.tanh(self.emb(value)), value
        h, ids = value
        assert not ids.is_floating_point() and not ids.requires_grad
        h = self.lin(torch.tanh(h + self.emb(ids)))
        return h if self.i == self.last else (h, ids)


def ids_alongside_block(i: int) -> nn.Module:
    return IdsAlongside(i, 4)


def ids_batch(step: int, batch: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(400 + step)
    return torch.randint(0, 10, (batch, 3), generator=g), torch.randint(0, 10, (batch, 3), generator=g)


def train_ids_reference(batch: int = 8) -> dict:
    from pipesched.runtime.stages.partition import build_block_seeded

    model = nn.Sequential(*(build_block_seeded(ids_alongside_block, i, 3) for i in range(5)))
    return _train_module(model, lambda step: ids_batch(step, batch), tied_loss)


def ids_alongside_run(rank: int, world: int, job: tuple) -> dict:
    """Each schedule over the model whose stages pass (float, int) tuples (bf16 too: the integer
    entry crosses as it is)."""
    runs, batch = job
    out = {}
    for label, schedule, dtype in runs:
        sample = ids_batch(0, batch)[0][: batch // schedule.microbatches]
        rt = PipelineRuntime(StagedModel(ids_alongside_block, 5, sample),
                             schedule, tied_loss, lambda ps: torch.optim.SGD(ps, lr=0.05),
                             options=RuntimeOptions(seed=3, timeout_s=60, dtype=dtype,
                                                    recompute="all" if "recomputed" in label else None))
        out[label] = _losses_grads_params(rt, lambda step: ids_batch(step, batch))
    return out


def staging_decision(rank: int, world: int, _job) -> bool:
    """Whether a rank's transport would stage messages through host memory for a device other
    than the CPU, over gloo (on 3 ranks a rank is not a member of every link group)."""
    import pipesched
    from pipesched.runtime.comm.p2p import Transport, make_link_groups
    from pipesched.runtime.program.instructions import ACT, GRAD
    from pipesched.runtime.program.program import links, lower
    from pipesched.runtime.stages.boundary import Boundary

    schedule = pipesched.build_schedule("1f1b", world, 2)
    groups = make_link_groups(links(schedule), 30)
    shapes = {(kind, s): Boundary.of(torch.zeros(1)) for kind in (ACT, GRAD) for s in range(world)}
    return Transport(lower(schedule, rank), groups, shapes, torch.device("meta"), 30).host_staging


def nonfinite_weights_run(rank: int, world: int, schedule) -> None:
    """One step with a NaN learning rate: every parameter becomes NaN after the optimizer step."""
    md = get_model("mlp", blocks=3, dim=8, hidden=16)
    x, y = md.batch(0, 8, 0)
    rt = PipelineRuntime(StagedModel(md.build_block, md.num_blocks, x[:2]),
                         schedule, md.loss_fn, lambda ps: torch.optim.SGD(ps, lr=float("nan")),
                         options=RuntimeOptions(timeout_s=60))
    rt.step(x, y)


CHECKPOINT_MODEL = {"blocks": 3, "dim": 8, "hidden": 16}


def checkpoint_crash_run(rank: int, world: int, job: tuple) -> None:
    """Two AdamW steps of a small MLP, checkpointed after each; rank 1 is killed (SIGKILL) in the
    middle of writing the second checkpoint, after its data file and before the metadata."""
    import torch.distributed.checkpoint as dcp


    directory, schedule = job
    md = get_model("mlp", **CHECKPOINT_MODEL)
    rt = PipelineRuntime(StagedModel(md.build_block, md.num_blocks, md.batch(0, 8, 0)[0][:2]),
                         schedule, md.loss_fn, make_optimizer("adamw", 0.01),
                         options=RuntimeOptions(timeout_s=60))
    rt.step(*md.batch(0, 8, 0))
    rt.save_checkpoint(directory)
    rt.step(*md.batch(1, 8, 0))
    if rank == 1:
        write_data = dcp.FileSystemWriter.write_data

        def write_then_die(self, plan, planner):
            write_data(self, plan, planner).wait()
            os.kill(os.getpid(), signal.SIGKILL)

        dcp.FileSystemWriter.write_data = write_then_die
    rt.save_checkpoint(directory)


def run_data_parallel(rank: int, world: int, job: tuple) -> dict:
    """Each (label, schedule, dtype, clip_grad_norm) of ``job`` on ``dp`` replicas of its pipeline
    (a 2D mesh of the world) for STEPS steps on the global batch; rank 0 returns losses,
    first-step grads and params, every rank's place on the mesh, and, after one more step of the
    last runtime on a batch with an infinite sample, whether each rank skipped it unchanged."""
    from pipesched.runtime.comm.mesh import init_pipeline_mesh

    model, size, batch, runs, dp = job
    md = get_model(model, **size)
    out = {}
    for label, schedule, dtype, clip in runs:
        mesh = init_pipeline_mesh(schedule.ranks, dp)
        x0, _ = md.batch(0, batch, 3)
        rt = PipelineRuntime(
            StagedModel(md.build_block, md.num_blocks, x0[: batch // (dp * schedule.microbatches)]),
            schedule, md.loss_fn, make_optimizer("sgd", 0.05), mesh=mesh,
            options=RuntimeOptions(seed=3, timeout_s=60, dtype=dtype, clip_grad_norm=clip, skip_nonfinite=True),
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


    directory, schedule = job
    md = get_model("mlp", **CHECKPOINT_MODEL)

    def fresh() -> PipelineRuntime:
        sample = md.batch(0, 8, 0)[0][: 8 // schedule.microbatches]
        return PipelineRuntime(StagedModel(md.build_block, md.num_blocks, sample),
                               schedule, md.loss_fn, make_optimizer("adamw", 0.01),
                               options=RuntimeOptions(timeout_s=60))

    whole = fresh()
    for step in range(4):
        whole.step(*md.batch(step, 8, 0))
    saved = fresh()
    for step in range(2):
        saved.step(*md.batch(step, 8, 0))
    saved.save_checkpoint(directory)
    resumed = fresh()
    resumed.load_checkpoint(checkpoint.latest(directory))
    for step in range(2, 4):
        resumed.step(*md.batch(step, 8, 0))
    out = []
    for rt in (whole, resumed):
        parts = [None] * world
        dist.all_gather_object(parts, {n: p.detach().clone() for n, p in rt.named_parameters()})
        out.append(parts)
    return tuple(out)


def prebuilt_model(seed: int = 7) -> nn.Sequential:
    """Four ``Linear(16, 16), GELU`` blocks built before any runtime (the documented
    ``sequential_builder`` path)."""
    torch.manual_seed(seed)
    return nn.Sequential(*(nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(4)))


def prebuilt_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)


def train_prebuilt_reference() -> dict:
    """The unpipelined run of :func:`prebuilt_model`: first loss and gradients, final parameters."""
    model = prebuilt_model()
    return _train_module(model, lambda step: prebuilt_batch(step), nn.functional.mse_loss)


def _train_module(model: nn.Module, batch, loss_fn) -> dict:
    """STEPS SGD steps of ``model`` on ``batch(step)``: first loss and gradients, final parameters
    (every name, tied ones under each)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, grads = [], None
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters(remove_duplicate=False) if p.grad is not None}
        opt.step()
        losses.append(loss.item())
    return {"loss": losses[0], "grads": grads, "params": {k: v.clone() for k, v in model.state_dict().items()}}


def prebuilt_run(rank: int, world: int, schedules: list) -> dict:
    """Each schedule over blocks of a model built before its runtime (a fresh one per schedule:
    the previous runtime trained the last), through ``sequential_builder``."""
    from pipesched.runtime.stages.partition import sequential_builder

    out = {}
    for label, schedule in schedules:
        build_block, n = sequential_builder(prebuilt_model())
        rt = PipelineRuntime(StagedModel(build_block, n, torch.zeros(8 // schedule.microbatches, 16)),
                             schedule, nn.functional.mse_loss, lambda ps: torch.optim.SGD(ps, lr=0.05),
                             options=RuntimeOptions(timeout_s=60))
        out[label] = _losses_grads_params(rt, prebuilt_batch)
    return out


def _losses_grads_params(rt: PipelineRuntime, batch) -> dict:
    losses, grads = [], None
    for step in range(STEPS):
        losses.append(rt.step(*batch(step)).loss)
        if step == 0:
            grads = rt.gather_gradients()
    return {"losses": losses, "grads": grads, "params": rt.gather_state_dict()}


TIED_VOCAB, TIED_DIM, TIED_BLOCKS = 11, 8, 6
TIED = (("0.weight", f"{TIED_BLOCKS - 1}.weight"),)


def tied_block(i: int) -> nn.Module:
    """An embedding, Linear-tanh blocks, and a head whose weight is the embedding's (when tied)."""
    if i == 0:
        return nn.Embedding(TIED_VOCAB, TIED_DIM)
    if i == TIED_BLOCKS - 1:
        return nn.Linear(TIED_DIM, TIED_VOCAB, bias=False)
    return nn.Sequential(nn.Linear(TIED_DIM, TIED_DIM), nn.Tanh())


def tied_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


def tied_batch(step: int, batch: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(200 + step)
    return torch.randint(0, TIED_VOCAB, (batch, 5), generator=g), torch.randint(0, TIED_VOCAB, (batch, 5), generator=g)


def train_tied_reference(batch: int = 8) -> dict:
    """The unpipelined tied model (block ``i`` seeded ``3 + i``; the head takes the embedding's weight)."""
    from pipesched.runtime.stages.partition import build_block_seeded

    model = nn.Sequential(*(build_block_seeded(tied_block, i, 3) for i in range(TIED_BLOCKS)))
    model[TIED_BLOCKS - 1].weight = model[0].weight
    return _train_module(model, lambda step: tied_batch(step, batch), tied_loss)


def tied_run(rank: int, world: int, job: tuple) -> dict:
    """Each schedule of ``job`` over the tied model on ``dp`` replicas: losses, first gradients,
    final parameters (rank 0), and whether every rank's copies of the tied weight are bitwise
    equal (each rank's copy gathered everywhere)."""
    import torch.distributed as dist

    from pipesched.runtime.comm.mesh import init_pipeline_mesh

    schedules, dp, batch, *resumes = job
    out = {}

    def runtime(schedule):
        sample = tied_batch(0, batch)[0][: batch // (dp * schedule.microbatches)]
        return PipelineRuntime(StagedModel(tied_block, TIED_BLOCKS, sample, tied=TIED),
                               schedule, tied_loss, lambda ps: torch.optim.SGD(ps, lr=0.05),
                               options=RuntimeOptions(seed=3, timeout_s=60),
                               mesh=init_pipeline_mesh(schedule.ranks, dp))

    for (saved, resumed), folder in resumes[0] if resumes else ():
        # one step under ``saved``, checkpointed; the remaining steps resumed under ``resumed``
        rt = runtime(dict(schedules)[saved])
        rt.step(*tied_batch(0, batch))
        path = rt.save_checkpoint(folder)
        rt = runtime(dict(schedules)[resumed])
        for step in range(rt.load_checkpoint(path), STEPS):
            rt.step(*tied_batch(step, batch))
        out[f"{saved} resumed under {resumed}"] = {"params": rt.gather_state_dict()}
    for label, schedule in schedules:
        rt = runtime(schedule)
        out[label] = _losses_grads_params(rt, lambda step: tied_batch(step, batch))
        copies = [p.detach().clone() for n, p in rt.named_parameters() if n in TIED[0]]
        everyone = [None] * world
        dist.all_gather_object(everyone, copies)
        held = [t for part in everyone for t in part]
        out[label]["copies_equal"] = len(held) >= 2 and all(torch.equal(held[0], t) for t in held)
        out[label]["optimized_once"] = sum(p.numel() for p in rt.parameters) == sum(
            p.numel() for _n, p in rt.named_parameters(unique=True))
    return out


class MaskedBlock(nn.Module):
    """A block that reads its microbatch's batch context: a float mask and integer positions of
    the hidden state's shape (as a decoder layer rebuilds its attention mask from the batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, context: dict) -> torch.Tensor:
        ctx = context
        assert ctx["mask"].shape == x.shape[:2], (ctx["mask"].shape, x.shape)  # this microbatch's slice
        return torch.tanh(self.lin(x)) * ctx["mask"][..., None] + x + 0.01 * ctx["pos"][..., None].to(x.dtype)


def masked_block(i: int) -> nn.Module:
    return MaskedBlock()


CONTEXT_LENGTHS = (5, 7, 5)  # the sequence length of each step


def context_batch(step: int, batch: int = 8) -> tuple[torch.Tensor, torch.Tensor, dict]:
    g = torch.Generator().manual_seed(300 + step)
    length = CONTEXT_LENGTHS[step]
    x, y = torch.randn(batch, length, 8, generator=g), torch.randn(batch, length, 8, generator=g)
    mask = (torch.rand(batch, length, generator=g) > 0.3).float()
    return x, y, {"mask": mask, "pos": torch.arange(length).expand(batch, length).contiguous()}


def train_context_reference(batch: int = 8) -> dict:
    """The unpipelined run of the masked model, given the whole batch's context."""
    from pipesched.runtime.stages.partition import Stage, build_block_seeded

    model = Stage(0, {i: build_block_seeded(masked_block, i, 3) for i in range(4)})
    contexts = [context_batch(step, batch)[2] for step in range(STEPS)]

    def loss_fn(out, y):
        return nn.functional.mse_loss(out, y)

    class WithContext(nn.Module):  # the model given the context of the step being run
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.step = 0

        def forward(self, x):
            self.step += 1
            return self.model(x, contexts[self.step - 1])

    wrapped = WithContext()
    ref = _train_module(wrapped, lambda step: context_batch(step, batch)[:2], loss_fn)
    strip = len("model.blocks.")
    return {"loss": ref["loss"], "grads": {k[strip:]: v for k, v in ref["grads"].items()},
            "params": {k[strip:]: v for k, v in ref["params"].items()}}


def context_run(rank: int, world: int, job: tuple) -> dict:
    """Each (label, schedule, recompute) over the masked model, the batch context given on every
    rank and the sequence length changing between steps (inputs passed on every rank)."""
    runs, batch = job
    out = {}
    for label, schedule, recompute in runs:
        x0, _, ctx0 = context_batch(0, batch)
        mb = batch // schedule.microbatches
        rt = PipelineRuntime(StagedModel(masked_block, 4, x0[:mb], sample_context={k: v[:mb] for k, v in ctx0.items()}),
                             schedule, nn.functional.mse_loss, lambda ps: torch.optim.SGD(ps, lr=0.05),
                             options=RuntimeOptions(seed=3, timeout_s=60, recompute=recompute))
        losses, grads = [], None
        for step in range(STEPS):
            x, y, ctx = context_batch(step, batch)
            losses.append(rt.step(x, y, ctx).loss)
            if step == 0:
                grads = rt.gather_gradients()
        out[label] = {"losses": losses, "grads": grads, "params": rt.gather_state_dict()}
    return out


def misuse_run(rank: int, world: int, schedule) -> list:
    """Every misuse the runtime must refuse on every rank alike (one line each, nothing hung):
    arguments that differ across ranks, a batch shaped unlike the other rank's on one rank, a
    loss that is not a scalar; then a rank that never starts its step under a short
    ``timeout_s`` (the default group waits 120 s). Returns what each case raised on this rank,
    and how long the last one waited."""
    import torch.distributed as dist

    from pipesched.errors import ConfigError

    md = get_model("mlp", blocks=3, dim=8, hidden=16)
    x, y = md.batch(0, 8, 0)
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731

    def build(loss=md.loss_fn, block_counts=None, **options):
        return PipelineRuntime(StagedModel(md.build_block, md.num_blocks, x[:2], block_counts=block_counts),
                               schedule, loss, sgd, options=RuntimeOptions(**{"timeout_s": 60, **options}))

    said = []

    def attempt(case) -> None:
        try:
            case()
            said.append(None)
        except ConfigError as err:
            said.append(str(err))

    attempt(lambda: build(block_counts=(2, 2) if rank == 0 else (3, 1)))
    attempt(lambda: build(seed=rank))
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
