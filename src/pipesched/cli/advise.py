"""``pipesched advise``: which schedule, how many chunks and microbatches, with the numbers.

The command's options are declared in groups (:mod:`.advise_flags`, :mod:`.advise_model`,
:mod:`.advise_layout`); the command checks them, tells which way the costs are given, refuses the
flags that way would ignore, and hands over to that way's search.
"""

from __future__ import annotations

from typing import Optional

import typer

from ..advise import Advice, advise, batch_plan
from ..advise.search import check_search_size
from ..costs import Costs
from ..errors import ConfigError
from ..jsontext import json_text
from ..registry import families as registered_families
from . import advise_layout as layout_options
from . import app
from . import options as opt
from .advise_flags import (
    SCOPE_OPTIONS,
    SEARCH_OPTIONS,
    SHRINKING_OVERHEAD,
    ScopeFlags,
    SearchFlags,
    by_flag,
    or_default,
    scope_options,
    search_options,
    searched,
)
from .advise_layout import LAYOUT_OPTIONS, LayoutFlags
from .advise_model import (
    MODEL_OPTIONS,
    PROFILE_OPTIONS,
    PROFILED_MICROBATCHES,
    ModelFlags,
    ProfileFlags,
    model_options,
    profile_options,
    transformer_costs,
)
from .advise_print import print_advice
from .progress import LayoutProgress, planning_progress

Limits = tuple[Optional[float], Optional[float]]  # --memory-limit in M_B, or a limit in bytes (one of the two)


@app.command("advise")
@search_options
@model_options
@profile_options
@scope_options
@layout_options.layout_options
def advise_cmd(ctx: typer.Context, ranks: int = opt.Ranks, *, search: SearchFlags, model: ModelFlags,
               profile: ProfileFlags, scope: ScopeFlags, layout: LayoutFlags) -> None:
    """Search every schedule, chunk count and microbatch count; recommend the fastest that fits."""
    model = model.resolved()  # --config's model description, --dtype's old spelling
    typed = {**by_flag(search, SEARCH_OPTIONS), **by_flag(model, MODEL_OPTIONS), **by_flag(profile, PROFILE_OPTIONS),
             **by_flag(scope, SCOPE_OPTIONS), **by_flag(layout, LAYOUT_OPTIONS)}
    # before any work: each of these sizes the search or enters the cost model
    opt.check_ranges({"--workers": scope.workers, **{flag: typed[flag] for flag in opt.RANGES if flag in typed}})
    mode = ("--profile" if profile.profile else "--gpus" if layout.gpus is not None
            else "a model description" if model.described else "given costs")
    refuse_ignored(mode, typed)
    limits = search.limits(profiled=profile.profile, described=model.described)
    if profile.profile:
        _advise_profiled(ranks, search, model, profile, scope, limits)
    elif layout.gpus is not None and (layout.gpus_per_node is not None or layout.fixed() or layout.ep is not None):
        source = ctx.get_parameter_source("ranks")  # typer's own click: its enum is not public, its names are
        pp_given = source is not None and source.name == "COMMANDLINE"  # -p given: it fixes pp
        refuse_ignored("--gpus --gpus-per-node", typed)
        _advise_whole_layout(ranks if pp_given else None, search, model, scope, layout, limits)
    elif layout.node_bandwidth is not None and layout.gpus_per_node is None:
        raise ConfigError("--node-bandwidth belongs to --gpus-per-node: give the GPUs per node")
    elif layout.gpus is not None or layout.report is not None:
        layout_options.run(
            layout.gpus, search.global_batch, transformer_costs(model, layout.gpus or ranks, search, *limits),
            layout.dp_bandwidth, layout.latency, layout.report, scope.as_json, scope.top, layouts_done=LayoutProgress(),
            **searched(search, scope),
        )
    else:
        _advise_pipeline(ranks, search, model, scope, limits)


def _advise_whole_layout(pp: Optional[int], search: SearchFlags, model: ModelFlags, scope: ScopeFlags,
                         layout: LayoutFlags, limits: Limits) -> None:
    """``advise --gpus G --gpus-per-node N`` (or a dimension fixed): the whole layouts
    (``pp``: the pipeline ranks, where ``-p`` fixed them)."""
    fixed = layout.fixed() | ({} if pp is None else {"pp": pp})
    layout_options.run_whole(
        layout.gpus, search.global_batch, transformer_costs(model, layout.gpus, search, *limits),
        layout.gpus_per_node, layout.node_bandwidth, fixed, layout.latency, layout.report, scope.as_json, scope.top,
        ep=layout.ep, progress=lambda work: planning_progress("advise", work), layouts_done=LayoutProgress(),
        **searched(search, scope),
    )


def _advise_pipeline(ranks: int, search: SearchFlags, model: ModelFlags, scope: ScopeFlags, limits: Limits) -> None:
    """One pipeline of ``ranks`` ranks, its costs from the model described or from ``--costs``."""
    memory_limit, limit_bytes = limits
    cost_model = costs = None
    if model.described:
        cost_model = transformer_costs(model, ranks, search, memory_limit, limit_bytes)
    else:
        costs = Costs.parse(search.costs, comm=search.comm or 0.0, multipliers=opt.parse_multipliers(search.stage_multipliers),
                            stage_overhead=search.stage_overhead or 0.0, full_backward=search.full_backward)
    result = advise(
        ranks, memory_limit, microbatches=search.microbatches, global_batch=search.global_batch,
        microbatch_size=search.microbatch_size, costs=costs, cost_model=cost_model,
        overhead=or_default(search.overhead, SHRINKING_OVERHEAD), progress=lambda work: planning_progress("advise", work),
        **searched(search, scope),
    )
    if scope.as_json:
        typer.echo(json_text(result.to_json()))
        return
    print_advice(result, cost_model, scope.top)


_WHOLE_LAYOUT = ("--gpus-per-node", "--node-bandwidth", "--tp", "--dp-shard", "--dp", "--ep")
IGNORED_BY = {  # what each way of giving the costs does without: refused rather than dropped silently
    "--profile": ("--overhead", "--microbatch-size", "--max-microbatches", "--min-microbatch-size",
                  "--dp-bandwidth", "--dp-latency", "--report", "--gpus") + _WHOLE_LAYOUT,
    "--gpus": ("--microbatches", "--overhead", "--model", "--batch-size", "--profile-steps"),
    "--gpus --gpus-per-node": ("--dp-bandwidth",),
    "a model description": ("--overhead", "--model", "--batch-size", "--profile-steps", "--dp-bandwidth",
                            "--dp-latency") + _WHOLE_LAYOUT,
    "given costs": ("--model", "--batch-size", "--profile-steps", "--dp-bandwidth", "--dp-latency") + _WHOLE_LAYOUT,
}
WHY_IGNORED = {
    "--profile": "the costs are measured at the profiled microbatches",
    "--gpus": "it chooses the microbatches and costs them from the model",
    "a model description": "the model gives each microbatch size's costs; the layout's flags belong to --gpus",
    "given costs": "--model, --batch-size and --profile-steps belong to --profile, --dp-* and the layout's flags to --gpus",
    "--gpus --gpus-per-node": "the nodes and their two bandwidths price every link",
}


def refuse_ignored(mode: str, values: dict) -> None:
    """A ConfigError naming the flags given that ``mode`` would ignore (see :data:`IGNORED_BY`)."""
    ignored = [flag for flag in IGNORED_BY[mode] if values.get(flag) is not None]
    if ignored:
        raise ConfigError(f"advise with {mode} ignores {', '.join(ignored)} ({WHY_IGNORED[mode]}): drop "
                          f"{'it' if len(ignored) == 1 else 'them'}")


def _advise_profiled(ranks: int, search: SearchFlags, model: ModelFlags, profile: ProfileFlags, scope: ScopeFlags,
                     limits: Limits) -> None:
    """Advice from costs measured by running the model (needs torch), printed."""
    model_name, batch_size, steps = profile.run()
    result = _profiled(ranks, search, model, (model_name, batch_size, steps), limits, quiet=scope.as_json,
                       **searched(search, scope, sizes=False))
    if scope.as_json:
        typer.echo(json_text(result.to_json()))
    else:
        print_advice(result, None, scope.top, trained_model=(model_name, batch_size))


def _profiled(ranks: int, search: SearchFlags, model: ModelFlags, run: tuple[str, int, int], limits: Limits,
              quiet: bool, **options) -> Advice:
    """Advice from costs measured by running ``run`` (model, samples per step, steps)."""
    clashes = {**search.given_costs(), "--global-batch": search.global_batch, **model.given()}
    clashes = [flag for flag, value in clashes.items() if value is not None]
    if clashes:
        raise ConfigError(f"--profile measures the costs itself: drop {', '.join(clashes)}")
    microbatches = search.microbatches or PROFILED_MICROBATCHES
    chosen = options["families"] if options["families"] is not None else registered_families()
    check_search_size(ranks, batch_plan(ranks, microbatches), chosen, options["max_chunks"])  # before any rank starts
    try:
        from ..training.profile import advise_from_profile, profile
    except ImportError:
        raise ConfigError("--profile needs PyTorch: pip install 'pipesched[torch]'") from None
    model_name, batch_size, steps = run
    prof = profile(model_name, ranks, microbatches, batch_size, steps=steps)
    if not quiet:
        from ..render.console import output_console

        output_console().print(prof.summary())
    memory_limit, limit_bytes = limits
    return advise_from_profile(prof, memory_limit, limit_bytes=limit_bytes, **options)
