"""Rank workers of tests/test_sharded_stages.py (spawned processes import this module by name).

Each case is one model as one stage, trained by microbatches the way a sharded pipeline stage
is: gradient sync off for every backward (:func:`no_sync_backward`), one ``reduce_grad`` at the
end of the step, then the optimizer. Every rank also runs the unsharded stage on the whole
batch (the reference) and returns how far the gathered gradients and weights are from it.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

STEPS = 2
MICROBATCHES = 2
MICROBATCH = 2  # samples per microbatch per data-parallel rank
LR = 0.1  # SGD's, large enough that a wrong gradient moves the weights visibly


def build_stage(kind: str):
    """(stage, plan) of a tiny fp32 model, the whole model as one stage, on the CPU."""
    from pipesched.runtime.sharding.model_plans import plan_for
    from pipesched.runtime.stages.partition import Stage, build_stage

    if kind == "gpt":
        from pipesched.training.models import gpt_model

        md = gpt_model(layers=2, dim=32, heads=4, context=16)
        return build_stage(md.build_block, range(md.num_blocks), 0, 0, torch.device("cpu")), plan_for("gpt")
    from hf_cases import make_model

    from pipesched.hf.architectures import architecture_of
    from pipesched.hf.blocks import model_blocks
    from pipesched.hf.splitting import prepare_split_backward

    prepare_split_backward()
    model = make_model(kind, torch.float32)
    blocks = model_blocks(model, architecture_of(model))
    return Stage(0, dict(enumerate(blocks))), plan_for(type(model).__name__, model.config)


def step_batch(kind: str, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    if kind == "gpt":
        from pipesched.training.datasets import text_batch

        return text_batch(step, size, 0, 16)
    from hf_cases import make_batch

    batch = make_batch(step, size, 12)
    return batch["input_ids"], batch["labels"]


def summed_loss(kind: str, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """gpt: the mean cross-entropy of the microbatch. Hugging Face models: the sum over the
    microbatch's labelled tokens (next-token, -100 ignored), token-weighted across the step."""
    if kind == "gpt":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
    return F.cross_entropy(out[:, :-1].reshape(-1, out.shape[-1]), target[:, 1:].reshape(-1), reduction="sum")


def labelled_tokens(kind: str, target: torch.Tensor) -> int:
    return int((target[:, 1:] != -100).sum()) if kind != "gpt" else 0


def routing_margins(stage) -> list[float]:
    """Hooks every mixture-of-experts router of ``stage`` (a module whose class name ends in
    "router", returning its logits first, as Qwen2-MoE's and DeepSeek-V3's do) so that each of its
    forwards appends to the returned list the smallest gap, over the tokens, between the logits of
    the last expert chosen and of the first left out: what an input would have to move by to
    route a token elsewhere. Both routers choose by a monotone function of the logits (softmax;
    sigmoid plus a bias that is zero here and not trained) in one expert group."""
    margins: list[float] = []

    def gap(router, _args, out) -> None:
        top = out[0].detach().topk(router.top_k + 1, dim=-1).values
        margins.append(float((top[:, -2] - top[:, -1]).min()))

    for module in stage.modules():
        if type(module).__name__.lower().endswith("router"):
            module.register_forward_hook(gap)
    return margins


def reference(stage, kind: str, batches) -> dict:
    """The unsharded stage on each whole batch with SGD: gradients and weights after each step,
    and the smallest routing margin seen (None without routers)."""
    stage = copy.deepcopy(stage)
    margins = routing_margins(stage)
    optimizer = torch.optim.SGD(stage.parameters(), lr=LR)
    grads, weights = [], []
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = summed_loss(kind, stage(x), y)
        (loss / (labelled_tokens(kind, y) or 1)).backward()
        grads.append({n: p.grad.clone() for n, p in stage.named_parameters()})
        optimizer.step()
        weights.append({n: p.detach().clone() for n, p in stage.named_parameters()})
    return {"grads": grads, "weights": weights, "routing_margin": min(margins, default=None)}


def gathered(tensors: dict) -> dict:
    """Whole copies of DTensors (``full_tensor`` over a mesh of one is the live tensor itself)."""
    return {n: t.full_tensor().clone() for n, t in tensors.items()}


def sharded_run(stage, plan, kind, batches, mesh, optimizer_cls, split: bool, reshard_after_forward: bool) -> dict:
    """``stage`` sharded on ``mesh``, trained on this rank's share of ``batches``: the gathered
    gradients and weights after each step, and the bytes held after the last."""
    from pipesched.runtime.sharding.sharded_measure import gathered_bytes, held_bytes
    from pipesched.runtime.sharding.sharding import (
        gradient_divisor,
        no_sync_backward,
        reduce_grad,
        reshard,
        shard_stage,
        unshard,
        wait,
    )

    regather = split and reshard_after_forward  # then also a RESHARD and an UNSHARD between each I and its W
    from pipesched.runtime.engine.split_backward import (
        WeightGradStash,
        apply_weight_grads,
        make_weight_grads_deferrable,
    )

    stash = WeightGradStash()
    if split:
        make_weight_grads_deferrable(stage, stash)
    shard_stage(stage, mesh, plan, reshard_after_forward)
    optimizer = optimizer_cls(stage.parameters(), lr=LR if optimizer_cls is torch.optim.SGD else 1e-3)
    layout, data = mesh.layout, mesh.pipeline
    out = {"grads": [], "weights": []}
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        tokens = labelled_tokens(kind, y)
        divisor = tokens or gradient_divisor(layout, MICROBATCHES)
        wait(unshard(stage))  # the UNSHARD ahead of the step's first forward, waited for
        out["gathered_bytes"] = gathered_bytes(stage)
        for xm, ym in zip(data.shard(x).chunk(MICROBATCHES), data.shard(y).chunk(MICROBATCHES)):
            no_sync_backward(stage)
            loss = summed_loss(kind, stage(xm), ym)
            stash.collecting = [] if split else None
            loss.backward()  # with split: the I, weight gradients stashed
            entries, stash.collecting = stash.collecting, None
            if split:
                out["deferred"] = len(entries)
                if regather:  # the accumulated unsharded gradients survive it
                    reshard(stage)
                    wait(unshard(stage))
                no_sync_backward(stage)
                apply_weight_grads(entries)  # the W
        out["unsharded_grad_bytes"] = gathered_bytes(stage, grads=True)
        reduce_grad(stage, divisor)
        out.setdefault("partial", partial_gradients(stage, mesh))  # the first step's, as the runtime's guard
        reshard(stage)
        out["grads"].append(gathered({n: p.grad for n, p in stage.named_parameters()}))
        optimizer.step()
        out["weights"].append(gathered({n: p.detach() for n, p in stage.named_parameters()}))
    out["bytes"] = held_bytes(stage, optimizer)
    out["trained"] = stage, optimizer
    return out


def partial_gradients(stage, mesh) -> list[str]:
    """The parameters of ``stage`` tensor parallelism left whole whose gradients differ across its
    ``tp`` group (:mod:`pipesched.runtime.sharding.tp_guard`; collective over the group)."""
    from pipesched.runtime.sharding.tp_guard import disagreeing, replicated_over_tp

    device = next(stage.parameters()).device
    return disagreeing(replicated_over_tp(stage.named_parameters()), mesh.tp_mesh.get_group(), device)


def refused_plan(mesh, device: str) -> dict:
    """Qwen3 under Llama's plan (its per-head q/k norms sit between the split projections), one
    step on the sharded stage: what the tp guard raised on this rank (None: nothing), and for
    each parameter it named, how far apart this ``tp`` group's gradients are (``||g_a - g_b||``
    over the largest ``||g||``)."""
    import torch.distributed as dist

    from pipesched.runtime.sharding.sharding import (
        gradient_divisor,
        no_sync_backward,
        reduce_grad,
        shard_stage,
        unshard,
        wait,
    )
    from pipesched.runtime.sharding.tp_guard import PartialGradients, check_tp_gradients
    from transformers import LlamaConfig

    stage, _ = build_stage("qwen3")
    stage.to(device)
    shard_stage(stage, mesh, dict(LlamaConfig.base_model_tp_plan))  # Llama's: q/k norms left plain
    x, y = (t.to(device) for t in step_batch("qwen3", 0, mesh.layout.dp * MICROBATCHES * MICROBATCH))
    wait(unshard(stage))
    for xm, ym in zip(mesh.pipeline.shard(x).chunk(MICROBATCHES), mesh.pipeline.shard(y).chunk(MICROBATCHES)):
        no_sync_backward(stage)
        summed_loss("qwen3", stage(xm), ym).backward()
    reduce_grad(stage, labelled_tokens("qwen3", y) or gradient_divisor(mesh.layout, MICROBATCHES))
    try:
        check_tp_gradients(stage.named_parameters(), mesh, torch.device(device))
        said = None
    except PartialGradients as err:
        said = str(err)
    group, apart = mesh.tp_mesh.get_group(), {}
    for name, p in stage.named_parameters():
        if name.rpartition(".")[0].endswith(("q_norm", "k_norm")):
            local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            every = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
            dist.all_gather(every, local.contiguous(), group=group)
            apart[name] = float((every[0] - every[1]).norm() / max(g.norm() for g in every))
    return {"said": said, "apart": apart}


def largest_difference(got: list[dict], want: list[dict]) -> float:
    return max(float((g[n] - w[n]).abs().max()) for g, w in zip(got, want) for n in w)


def run_case(layout_sizes: dict, kinds: list, device: str = "cpu", timeout_s: float = 120) -> dict:
    """Every model of ``kinds`` on one layout: errors against the reference, split against fused,
    bytes (``layout_sizes`` may say ``reshard_after_forward``)."""
    from pipesched.parallel_layout import runtime_layout
    from pipesched.runtime.sharding.sharded_mesh import init_sharded_mesh
    from pipesched.runtime.sharding.tp_plans import param_specs

    layout_sizes = dict(layout_sizes)
    resharded = layout_sizes.pop("reshard_after_forward", False)
    layout = runtime_layout(**layout_sizes)
    mesh = init_sharded_mesh(layout, timeout_s, device_type=torch.device(device).type)
    out = {"coordinates": (mesh.tp_rank, mesh.shard_rank)}
    size = layout.dp * MICROBATCHES * MICROBATCH
    for kind in kinds:
        stage, plan = build_stage(kind)
        stage.to(device)
        batches = [tuple(t.to(device) for t in step_batch(kind, step, size)) for step in range(STEPS)]
        want = reference(stage, kind, batches)
        fused = sharded_run(copy.deepcopy(stage), plan, kind, batches, mesh, torch.optim.SGD, False, resharded)
        split = sharded_run(copy.deepcopy(stage), plan, kind, batches[:1], mesh, torch.optim.AdamW, True, resharded)
        if any(style.startswith("colwise_fused") for style in plan.values()):  # interleaved pieces
            from sharded_checkpoint_case import checkpoint_round_trip

            out.setdefault("checkpoint", {})[kind] = checkpoint_round_trip(stage, plan, mesh, split["trained"])
        out[kind] = {
            "grad_error": largest_difference(fused["grads"], want["grads"]),
            "weight_error": largest_difference(fused["weights"], want["weights"]),
            "split_vs_fused": largest_difference(split["grads"], fused["grads"][:1]),
            "deferred": split["deferred"],
            "largest_grad": max(float(g.abs().max()) for step in want["grads"] for g in step.values()),
            "routing_margin": want["routing_margin"],
            "specs": param_specs(stage, plan),
            "bytes": split["bytes"],
            "gathered_bytes": split["gathered_bytes"],
            "unsharded_grad_bytes": split["unsharded_grad_bytes"],
            "partial": fused["partial"] + split["partial"],
        }
    if layout.tp > 1 and not resharded:
        out["refused"] = refused_plan(mesh, device)
    return out


def several_layouts(rank: int, world: int, cases: dict, device: str = "cpu") -> dict:
    """Each ``label: (layout sizes, model kinds)`` of ``cases`` in one launch, on ``device``."""
    return {label: run_case(sizes, kinds, device) for label, (sizes, kinds) in cases.items()}


def placements(rank: int, world: int, _payload=None) -> dict:
    """This rank's pipeline coordinates and groups under init_pipeline_mesh(2, 2) and under
    init_sharded_mesh of the same layout (pp 2 x dp_replicate 2), and its device-mesh
    coordinates at pp 2 x dp_shard 2."""
    import torch.distributed as dist

    from pipesched.runtime.comm.mesh import init_pipeline_mesh
    from pipesched.parallel_layout import runtime_layout
    from pipesched.runtime.sharding.sharded_mesh import init_sharded_mesh

    def seen(mesh) -> tuple:
        groups = [dist.get_process_group_ranks(g) if g is not None else None for g in (mesh.pp_group, mesh.dp_group)]
        return mesh.pp, mesh.dp, mesh.pp_rank, mesh.dp_rank, mesh.grid, groups

    sharded = init_sharded_mesh(runtime_layout(pp=2, dp_shard=2))
    return {"existing": seen(init_pipeline_mesh(2, 2)), "layout": seen(init_sharded_mesh(runtime_layout(pp=2, dp_replicate=2)).pipeline),
            "sharded": (sharded.pipeline.pp_rank, sharded.shard_rank, sharded.device_mesh.mesh.tolist(),
                        sharded.pipeline.dp_group)}


def suite(rank: int, world: int, cases: dict) -> dict:
    """The whole launch of tests/test_sharded_stages.py: every case, then the placements."""
    return {"cases": several_layouts(rank, world, cases), "placements": placements(rank, world)}
