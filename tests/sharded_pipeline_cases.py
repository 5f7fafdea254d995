"""Rank workers of tests/test_sharded_pipelines.py and benchmarks/sharded_layouts.py: whole
pipelines over sharded layouts (spawned processes import this module by name)."""

from __future__ import annotations

import torch
from sharded_cases import LR

ADAMW_LR = 0.01  # the pipelined gpt's AdamW (weight decay 0.01 on matrices, make_optimizer's)
# the steps of every run: the second computes on the weights the first stepped, gathered again from
# the updated shards, as every later step does
STEPS = 2
CLIP = 0.05  # well under the pipelined gpt's gradient norm: every step is clipped
EVAL_BATCHES = 2  # held-out batches of a run's evaluation
# the schedules evaluated: a fused backward, a V whose weight gradients wait for W, two model copies
EVALUATED = ("1f1b", "zb-v", "dualpipe")


def pipelined_layouts(rank: int, world: int, job: tuple) -> dict:
    """Each (label, schedule, (dp_replicate, dp_shard, tp)[, settings]) of ``job`` (size, batch,
    runs[, device]): the gpt pipelined by PipelineRuntime over that sharded layout for
    ``STEPS`` steps on the global batch, SGD or (``settings["optimizer"]``) AdamW at
    ``ADAMW_LR``, gradients clipped to ``settings["clip"]`` if given, the stages
    ``settings["recompute"]`` names recomputed; rank 0 returns its losses, first-step gradients
    and the runtime's gradient norm of them, final weights gathered whole, every rank's state
    bytes and its first step's (pipeline rank, measured, predicted) peak activation bytes. A run of an
    ``EVALUATED`` schedule without settings also evaluates ``EVAL_BATCHES`` held-out batches (steps
    no run reads) after its first step, and returns the loss, the batches and the weights evaluated."""
    from pipesched.runtime.executor import PipelineRuntime
    from pipesched.runtime.options import RuntimeOptions
    from pipesched.runtime.stages.staged_model import StagedModel
    from pipesched.parallel_layout import runtime_layout
    from pipesched.runtime.sharding.sharded_mesh import init_sharded_mesh
    from pipesched.runtime.sharding.model_plans import plan_for
    from pipesched.runtime.stages.copies import input_ranks, loss_ranks
    from pipesched.training.evaluation import evaluate_pipeline
    from pipesched.training.models import get_model
    from pipesched.training.optimizers import make_optimizer

    size, batch, runs, *where = job
    device = torch.device(where[0] if where else "cpu")
    md = get_model("gpt", **size)
    meshes, out = {}, {}
    for label, schedule, (replicas, shards, tp), *settings in runs:
        settings = settings[0] if settings else {}
        layout = runtime_layout(schedule.ranks, replicas, shards, tp)
        if layout not in meshes:
            meshes[layout] = init_sharded_mesh(layout, timeout_s=60, device_type=device.type)
        mesh = meshes[layout]
        x0, _ = md.batch(0, batch, 3)
        name = settings.get("optimizer", "sgd")
        sample = x0[: batch // (layout.dp * schedule.microbatches)]
        rt = PipelineRuntime(StagedModel(md.build_block, md.num_blocks, sample, tp_plan=plan_for("gpt")),
                             schedule, md.loss_fn, make_optimizer(name, ADAMW_LR if name == "adamw" else 0.05), mesh=mesh,
                             options=RuntimeOptions(seed=3, timeout_s=60, device=device, clip_grad_norm=settings.get("clip"),
                                                    recompute=settings.get("recompute")))
        losses, grads = [], None
        evaluated = {} if schedule.name in EVALUATED and not settings else None
        pp_rank = mesh.pipeline.pp_rank
        for step in range(STEPS):
            x, y = md.batch(step, batch, 3)
            result = rt.step(x if pp_rank in input_ranks(schedule) else None,
                             y if pp_rank in loss_ranks(schedule) else None)
            losses.append(result.loss)
            if step == 0:
                grads, grad_norm = rt.gather_gradients(), rt.grad_norm()
                activations = (pp_rank, result.peak_activation_bytes, rt.predicted_peak_activation_bytes())
                if evaluated is not None:
                    held_out = [md.batch(STEPS + i, batch, 3) for i in range(EVAL_BATCHES)]
                    evaluated = {"loss": evaluate_pipeline(rt, md.batch_context, held_out), "batches": held_out,
                                 "params": rt.gather_state_dict()}
        out[label] = {"losses": losses, "grads": grads, "grad_norm": grad_norm, "params": rt.gather_state_dict(), "state_bytes": all_ranks(rt.state_bytes()),
                      "activations": all_ranks(activations)}
        if evaluated is not None:
            out[label]["eval"] = evaluated
    return out if rank == 0 else None


def hf_pipelined_layouts(rank: int, world: int, job: tuple) -> dict:
    """Each (label, model kind, schedule, (dp_replicate, dp_shard, tp)[, settings]) of ``job``
    (runs, batches[, device]): a Hugging Face model pipelined by ``pipesched.hf.pipeline`` over the
    sharded layout, fp32, SGD (or, ``settings["optimizer"]`` ``"adamw"``, hf_cases' AdamW), on the
    batches; rank 0 returns the losses, first gradients, final weights and every rank's state bytes.
    A run whose settings give a ``tp_plan`` the tp guard refuses returns :func:`refused_step`'s."""
    from hf_cases import adamw, make_model

    import pipesched.hf as hf
    from pipesched.runtime.options import RuntimeOptions
    from pipesched.parallel_layout import runtime_layout
    from pipesched.runtime.sharding.sharded_mesh import init_sharded_mesh

    runs, batches, *where = job
    device = torch.device(where[0] if where else "cpu")
    meshes, out = {}, {}
    for label, kind, schedule, (replicas, shards, tp), *settings in runs:
        settings = settings[0] if settings else {}
        layout = runtime_layout(schedule.ranks, replicas, shards, tp)
        if layout not in meshes:
            meshes[layout] = init_sharded_mesh(layout, timeout_s=60, device_type=device.type)
        make_optimizer = adamw if settings.get("optimizer") == "adamw" else lambda ps: torch.optim.SGD(ps, lr=LR)
        options = RuntimeOptions(timeout_s=60, device=device)
        rt = hf.pipeline(make_model(kind, torch.float32), schedule, optimizer=make_optimizer,
                         sample_batch=batches[0], mesh=meshes[layout], options=options, tp_plan=settings.get("tp_plan"))
        if "tp_plan" in settings:
            out[label] = refused_step(rt, batches[0])
            continue
        losses, grads = [], None
        for step, batch in enumerate(batches):
            losses.append(rt.step(batch).loss)
            if step == 0:
                grads = rt.gather_gradients()
        out[label] = {"losses": losses, "grads": grads, "params": rt.gather_state_dict(), "state_bytes": all_ranks(rt.runtime.state_bytes())}
    return out if rank == 0 else None


def refused_step(rt, batch: dict) -> dict:
    """One step of ``rt`` (a ``pipesched.hf`` pipeline) whose plan the tp guard refuses: what each
    rank raised (None: nothing), and whether the gathered weights after it are those before it."""
    from pipesched.runtime.sharding.tp_guard import PartialGradients

    before = rt.gather_state_dict()
    try:
        rt.step(batch)
        said = None
    except PartialGradients as err:
        said = str(err)
    after = rt.gather_state_dict()
    unchanged = before is None or all(torch.equal(before[name], after[name]) for name in before)  # None: not rank 0
    return {"said": all_ranks(said), "unchanged": unchanged}


def held_out_error(size: dict, evaluated: dict) -> float:
    """How far a run's held-out loss (``pipelined_layouts``' ``"eval"``) is from the one-process
    gpt's of ``size`` on the gathered weights it evaluated and the same batches."""
    from contextlib import nullcontext

    from pipesched.training.evaluation import evaluate_model
    from pipesched.training.models import get_model

    md = get_model("gpt", **size)
    model = md.sequential(3)
    model.load_state_dict(evaluated["params"])
    return abs(evaluated["loss"] - evaluate_model(md, model, evaluated["batches"], nullcontext))


def all_ranks(value) -> list:
    """``value`` of every rank, in rank order (collective)."""
    values = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(values, value)
    return values
