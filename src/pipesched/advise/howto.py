"""How to run what the advisor recommends: commands and calls that are accepted as printed.

The advisor plans for costs (given, measured, or from a model's dimensions), not for one of
``pipesched train``'s built-in models, so its guidance is the schedule itself (``pipesched
export`` or ``pipesched.build_schedule`` with the candidate's costs and limit, which rebuild the
simulated order) and the runtime calls that run it on the user's own model under torchrun
(docs/runtime.md, "Your own model"; docs/data-parallel.md for replicas). ``pipesched train``
appears only for a measured built-in model whose blocks split into the schedule's stages.
"""

from __future__ import annotations

from typing import Optional

from ..costs import UNIT, Costs
from ..registry import get_family
from .result import Candidate


def csv_name(c: Candidate) -> str:
    """The file the printed ``export`` command writes (and a printed ``train --csv`` reads)."""
    return f"{c.schedule}.csv"


def guidance(c: Candidate, pp: int, dp: int = 1, train: Optional[str] = None) -> list[str]:
    """The lines that say how to build and run ``c`` on ``pp`` pipeline ranks x ``dp`` replicas.

    ``train``: a ``pipesched train`` command that runs it, where the caller (the CLI, which knows
    the built-in models) found one that train accepts.
    """
    lines = [f"Build it: {export_command(c, pp)} -o {csv_name(c)}"]
    if train is not None:
        lines.append(f"Train it: {train}")
    world = pp * dp
    mesh = f", mesh=init_pipeline_mesh(pp={pp}, dp={dp})" if dp > 1 else ""
    counts = ", block_counts=COUNTS" if c.layers_per_stage else ""
    options = ', options=RuntimeOptions(recompute="all")' if c.recompute != "none" else ""
    lines += [
        "Run it on your own model (docs/runtime.md, docs/data-parallel.md), on every rank:",
        f"  schedule = {build_call(c, pp)}",
        f"  runtime = PipelineRuntime(StagedModel(build_block, num_blocks, sample_input{counts}), schedule, loss_fn, "
        f"optimizer{options}{mesh})",
    ]
    if c.layers_per_stage:
        lines.append("  COUNTS: your blocks per stage, split as the layers per stage above")
    lines.append(
        f"Launch: torchrun --nproc-per-node {world} YOUR_SCRIPT.py (WORLD_SIZE = pp x dp = {pp} x {dp} = {world}; "
        f"on N nodes: --nnodes N --nproc-per-node {world}/N)"
    )
    return lines


def export_command(c: Candidate, ranks: int) -> str:
    """``pipesched export`` with every flag that rebuilds ``c``'s order (costs steer some families)."""
    flags = f" --memory-limit {c.memory_limit:.10g}" if c.memory_limit is not None else ""
    flags += f" --objective {c.objective}" if _steered_by_objective(c) else ""
    costs = c.costs
    if _costs_matter(costs):
        flags += f" --costs {costs.F:.10g},{costs.B:.10g},{costs.W:.10g}"
        flags += f" --comm {costs.comm:.10g}" if costs.comm else ""
        flags += f" --stage-overhead {costs.stage_overhead:.10g}" if costs.stage_overhead else ""
        flags += f" --full-backward {costs.full_backward:.10g}" if costs.full_backward is not None else ""
        flags += f" --overlap {costs.overlap:.10g}" if costs.overlap != UNIT.overlap else ""
        if costs.stage_multipliers:
            flags += " --stage-multipliers " + ",".join(f"{x:.10g}" for x in costs.stage_multipliers)
    return f"pipesched export {c.schedule} --ranks {ranks} --microbatches {c.microbatches} --chunks {c.chunks}{flags}"


def build_call(c: Candidate, ranks: int) -> str:
    """The ``pipesched.build_schedule(...)`` call that rebuilds ``c``."""
    args = [f'"{c.schedule}"', f"ranks={ranks}", f"microbatches={c.microbatches}", f"chunks={c.chunks}"]
    costs = c.costs
    if _costs_matter(costs):
        fields = [f"F={costs.F:.10g}", f"B={costs.B:.10g}", f"W={costs.W:.10g}"]
        fields += [f"comm={costs.comm:.10g}"] if costs.comm else []
        fields += [f"stage_overhead={costs.stage_overhead:.10g}"] if costs.stage_overhead else []
        fields += [f"full_backward={costs.full_backward:.10g}"] if costs.full_backward is not None else []
        fields += [f"overlap={costs.overlap:.10g}"] if costs.overlap != UNIT.overlap else []
        if costs.stage_multipliers:
            fields.append("stage_multipliers=(" + ", ".join(f"{x:.10g}" for x in costs.stage_multipliers) + ")")
        args.append(f"costs=pipesched.Costs({', '.join(fields)})")
    if c.memory_limit is not None:
        args.append(f"memory_limit={c.memory_limit:.10g}")
    if _steered_by_objective(c):
        args.append(f'objective="{c.objective}"')
    return f"pipesched.build_schedule({', '.join(args)})"


def _costs_matter(costs: Costs) -> bool:
    return (costs.F, costs.B, costs.W, costs.comm, costs.stage_multipliers, costs.stage_overhead, costs.full_backward) != (
        UNIT.F, UNIT.B, UNIT.W, UNIT.comm, UNIT.stage_multipliers, UNIT.stage_overhead, UNIT.full_backward)


def _steered_by_objective(c: Candidate) -> bool:
    return bool(c.objective) and c.objective != "makespan" and get_family(c.schedule).uses_objective
