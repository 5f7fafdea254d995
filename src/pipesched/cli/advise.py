"""``pipesched advise``: which schedule, how many chunks and microbatches, with the numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..jsontext import json_text
from ..advise import Advice, advise, batch_plan
from ..advise.search import check_search_size
from ..advise.estimate import (
    ATTENTION_KERNELS, DEFAULT_TFLOPS, DTYPE_BYTES, Hardware, TransformerCosts, TransformerSpec,
)
from ..advise.layout import DEFAULT_DP_LATENCY_MS
from ..costs import Costs
from ..errors import ConfigError
from ..registry import families as registered_families, get_family
from . import app
from . import advise_layout as layout_options
from . import options as opt
from .progress import planning_progress
from .advise_print import print_advice
from .renamed import deprecated_option, renamed


_MODEL_FLAGS = ("--layers", "--hidden", "--seq-len")
_HARDWARE_FLAGS = ("--heads", "--vocab", "--attention", "--activation-dtype", "--gpu-memory", "--bandwidth", "--flops")


@app.command("advise")
def advise_cmd(
    ctx: typer.Context,
    ranks: int = opt.Ranks,
    memory_limit: Optional[str] = typer.Option(
        None, "--memory-limit",
        help="Memory per rank: in M_B, activations only (one microbatch's activations of a rank's share); "
        "or in bytes (40GiB, 512MiB) with a model description or --profile: all the advisor counts per GPU "
        "(weights, gradients, optimizer state and activations, as --gpu-memory; with --profile the measured "
        "activations), the bytes it reports as peak_memory_bytes.",
    ),
    microbatches: Optional[int] = typer.Option(None, "--microbatches", "-m", help="Fixed microbatch count M."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", help="Samples per iteration G: the advisor also chooses M."),
    microbatch_size: Optional[int] = typer.Option(None, "--microbatch-size", help="Samples per microbatch b that the costs describe."),
    costs: Optional[str] = opt.CostsOpt,
    comm: Optional[float] = typer.Option(None, "--comm", help="Latency of every cross-rank transfer, in cost units."),
    stage_overhead: Optional[float] = typer.Option(None, "--stage-overhead", help=opt.StageOverhead.help),
    full_backward: Optional[float] = opt.FullBackward,
    stage_multipliers: Optional[str] = opt.Multipliers,
    objective: str = typer.Option("makespan", "--objective", help="makespan (optimizer step syncs ranks) or span."),
    max_chunks: int = typer.Option(4, "--max-chunks", help="Most chunks per rank to try."),
    max_microbatches: Optional[int] = typer.Option(None, "--max-microbatches", help="Most microbatches (default max(G/b, 8p))."),
    min_microbatch_size: Optional[int] = typer.Option(None, "--min-microbatch-size", help="Smallest microbatch (default 1)."),
    overhead: Optional[float] = typer.Option(None, "--overhead", help="With --costs: the part of F, B, W not shrinking."),
    layers: Optional[int] = typer.Option(None, "--layers", help="Model: transformer layers L."),
    hidden: Optional[int] = typer.Option(None, "--hidden", help="Model: hidden size h."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Model: sequence length s."),
    heads: Optional[int] = typer.Option(None, "--heads", help="Model: attention heads a (default h/64)."),
    vocab: Optional[int] = typer.Option(None, "--vocab", help="Model: vocabulary V (adds embedding and head)."),
    attention: Optional[str] = typer.Option(
        None, "--attention", help="Model: flash (default; SDPA keeps no score matrix) or eager (keeps a*s*s per sequence)."
    ),
    dtype: Optional[str] = typer.Option(None, "--activation-dtype", help="Model: activation precision, bf16 (default), fp16 or fp32."),
    gpu_memory: Optional[float] = typer.Option(None, "--gpu-memory", help="GB per device: sets the memory limit."),
    bandwidth: Optional[float] = typer.Option(None, "--bandwidth", help="GB/s between neighbouring ranks: sets comm."),
    flops: Optional[float] = typer.Option(None, "--flops", help=f"Effective TFLOP/s per device (default {DEFAULT_TFLOPS:g})."),
    profile: bool = typer.Option(False, "--profile", help="Measure the costs: run a few steps of --model on --ranks local ranks."),
    model_name: Optional[str] = typer.Option(None, "--model", help="With --profile: mlp (default), gpt or hf:CONFIG.json (train's models)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="With --profile: samples per step (default 64)."),
    profile_steps: Optional[int] = typer.Option(None, "--profile-steps", help="With --profile: steps to measure (default 4)."),
    old_dtype: Optional[str] = deprecated_option("--dtype", "--activation-dtype"),
    schedules: Optional[str] = typer.Option(None, "--schedules", help="Only these schedules, comma-separated (default: all)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Processes for the search (default: the CPUs)."),
    top: int = typer.Option(12, "--top", help="Rows in the table."),
    as_json: bool = typer.Option(False, "--json", help="Print the candidates as a JSON list, best first."),
    gpus: Optional[int] = layout_options.Gpus,
    dp_bandwidth: Optional[float] = layout_options.DpBandwidth,
    dp_latency: Optional[float] = layout_options.DpLatency,
    report: Optional[Path] = layout_options.Report,
    gpus_per_node: Optional[int] = layout_options.GpusPerNode,
    node_bandwidth: Optional[float] = layout_options.NodeBandwidth,
    tp: Optional[int] = layout_options.Tp,
    dp_shard: Optional[int] = layout_options.DpShard,
    dp: Optional[int] = layout_options.Dp,
) -> None:
    """Search every schedule, chunk count and microbatch count; recommend the fastest that fits."""
    dtype = renamed("advise", "--dtype", "--activation-dtype", old_dtype, dtype)
    opt.check_ranges({  # before any work: each of these sizes the search or enters the cost model
        "--workers": workers, "--max-chunks": max_chunks, "--layers": layers, "--hidden": hidden, "--seq-len": seq_len,
        "--heads": heads, "--vocab": vocab, "--gpus": gpus, "--global-batch": global_batch,
        "--microbatch-size": microbatch_size, "--max-microbatches": max_microbatches,
        "--min-microbatch-size": min_microbatch_size, "--top": top, "--batch-size": batch_size,
        "--profile-steps": profile_steps, "--gpu-memory": gpu_memory, "--bandwidth": bandwidth, "--flops": flops,
        "--dp-bandwidth": dp_bandwidth, "--dp-latency": dp_latency, "--overhead": overhead,
        "--gpus-per-node": gpus_per_node, "--node-bandwidth": node_bandwidth, "--tp": tp, "--dp-shard": dp_shard,
        "--dp": dp,
    })
    given = {
        "--layers": layers, "--hidden": hidden, "--seq-len": seq_len, "--heads": heads, "--vocab": vocab,
        "--gpu-memory": gpu_memory, "--bandwidth": bandwidth, "--flops": flops,
        "--attention": attention, "--activation-dtype": dtype,
    }
    profiled = {"--stage-overhead": stage_overhead, "--full-backward": full_backward}  # what a profile measures
    model = None
    described = any(given[f] is not None for f in _MODEL_FLAGS + _HARDWARE_FLAGS)
    mode = "--profile" if profile else "--gpus" if gpus is not None else "a model description" if described else "given costs"
    refuse_ignored(mode, {
        "--overhead": overhead, "--microbatch-size": microbatch_size, "--max-microbatches": max_microbatches,
        "--min-microbatch-size": min_microbatch_size, "--microbatches": microbatches, "--model": model_name,
        "--batch-size": batch_size, "--profile-steps": profile_steps, "--dp-bandwidth": dp_bandwidth,
        "--dp-latency": dp_latency, "--report": report, "--gpus": gpus, "--gpus-per-node": gpus_per_node,
        "--node-bandwidth": node_bandwidth, "--tp": tp, "--dp-shard": dp_shard, "--dp": dp,
    })
    model_name, batch_size, profile_steps = _or(model_name, "mlp"), _or(batch_size, 64), _or(profile_steps, 4)
    min_microbatch_size, overhead = _or(min_microbatch_size, 1), _or(overhead, 0.0)
    dp_latency = _or(dp_latency, DEFAULT_DP_LATENCY_MS)
    memory_limit, limit_bytes = opt.parse_memory_limit(memory_limit, bytes_known=profile or described)
    if profile:
        result = _profiled(
            ranks, memory_limit, microbatches, given, costs, comm, stage_multipliers, global_batch, profiled,
            model_name, batch_size, profile_steps, limit_bytes=limit_bytes, objective=objective, max_chunks=max_chunks,
            families=_families(schedules), workers=workers, quiet=as_json,
        )
        if as_json:
            typer.echo(json_text(result.to_json()))
        else:
            print_advice(result, None, top, trained_model=(model_name, batch_size))
        return
    fixed = {k: v for k, v in (("tp", tp), ("dp_shard", dp_shard), ("dp_replicate", dp)) if v is not None}
    if gpus is not None and (gpus_per_node is not None or fixed):
        source = ctx.get_parameter_source("ranks")
        if source is not None and source.name == "COMMANDLINE":  # -p given: it fixes pp
            fixed["pp"] = ranks
        refuse_ignored("--gpus --gpus-per-node", {"--dp-bandwidth": dp_bandwidth})
        layout_options.run_whole(
            gpus, global_batch,
            _model(gpus, given, microbatch_size, memory_limit, limit_bytes, costs, comm, stage_multipliers, profiled),
            gpus_per_node, node_bandwidth, fixed, dp_latency, report, as_json, top,
            objective=objective, max_chunks=max_chunks, min_microbatch_size=min_microbatch_size,
            max_microbatches=max_microbatches, families=_families(schedules), workers=workers,
        )
        return
    if node_bandwidth is not None and gpus_per_node is None:
        raise ConfigError("--node-bandwidth belongs to --gpus-per-node: give the GPUs per node")
    if gpus is not None or report is not None:
        layout_options.run(
            gpus, global_batch,
            _model(gpus or ranks, given, microbatch_size, memory_limit, limit_bytes, costs, comm, stage_multipliers,
                   profiled),
            dp_bandwidth, dp_latency, report, as_json, top,
            objective=objective, max_chunks=max_chunks, min_microbatch_size=min_microbatch_size,
            max_microbatches=max_microbatches, families=_families(schedules), workers=workers,
        )
        return
    if described:
        model = _model(ranks, given, microbatch_size, memory_limit, limit_bytes, costs, comm, stage_multipliers,
                       profiled)
        c = None
    else:
        c = Costs.parse(costs, comm=comm or 0.0, multipliers=opt.parse_multipliers(stage_multipliers),
                        stage_overhead=stage_overhead or 0.0, full_backward=full_backward)
    result = advise(
        ranks, memory_limit, microbatches=microbatches, global_batch=global_batch,
        microbatch_size=microbatch_size, costs=c, cost_model=model, objective=objective,
        max_chunks=max_chunks, min_microbatch_size=min_microbatch_size,
        max_microbatches=max_microbatches, overhead=overhead, families=_families(schedules), workers=workers,
        progress=lambda work: planning_progress("advise", work),
    )
    if as_json:
        typer.echo(json_text(result.to_json()))
        return
    print_advice(result, model, top)


_WHOLE_LAYOUT = ("--gpus-per-node", "--node-bandwidth", "--tp", "--dp-shard", "--dp")
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


def _or(value, default):
    """A flag's value, or its default where it was not given (flags default to None, so that a
    flag given is told apart from one left out)."""
    return default if value is None else value


def refuse_ignored(mode: str, values: dict) -> None:
    """A ConfigError naming the flags given that ``mode`` would ignore (see :data:`IGNORED_BY`)."""
    ignored = [flag for flag in IGNORED_BY[mode] if values.get(flag) is not None]
    if ignored:
        raise ConfigError(f"advise with {mode} ignores {', '.join(ignored)} ({WHY_IGNORED[mode]}): drop "
                          f"{'it' if len(ignored) == 1 else 'them'}")


def _profiled(ranks, memory_limit, microbatches, given, costs, comm, multipliers, global_batch, profiled,
              model_name, batch_size, steps, quiet: bool, limit_bytes: Optional[float] = None, **options) -> Advice:
    """Advice from costs measured by running the model (needs torch)."""
    clashes = [f for f, v in (("--costs", costs), ("--comm", comm), ("--stage-multipliers", multipliers),
                              *profiled.items(), ("--global-batch", global_batch)) if v is not None]
    clashes += [f for f, v in given.items() if v is not None]
    if clashes:
        raise ConfigError(f"--profile measures the costs itself: drop {', '.join(clashes)}")
    microbatches = microbatches or 8
    chosen = options["families"] if options.get("families") is not None else registered_families()
    check_search_size(ranks, batch_plan(ranks, microbatches), chosen, options["max_chunks"])  # before any rank starts
    try:
        from ..runtime.profile import advise_from_profile, profile
    except ImportError:
        raise ConfigError("--profile needs PyTorch: pip install 'pipesched[torch]'") from None
    prof = profile(model_name, ranks, microbatches, batch_size, steps=steps)
    if not quiet:
        from rich.console import Console

        Console().print(prof.summary())
    return advise_from_profile(prof, memory_limit, limit_bytes=limit_bytes, **options)


def _families(names: Optional[str]) -> Optional[list]:
    if names is None:
        return None
    chosen = [get_family(n) for n in names.split(",") if n.strip()]
    if not chosen:
        raise ConfigError("--schedules needs at least one schedule name (pipesched list shows them)")
    return chosen


def _model(ranks, given, microbatch_size, memory_limit, limit_bytes, costs, comm, multipliers,
           profiled: dict) -> TransformerCosts:
    missing = [f for f in _MODEL_FLAGS if given[f] is None]
    if microbatch_size is None:
        missing.append("--microbatch-size")
    if missing:
        raise ConfigError(
            "a model description needs --layers, --hidden, --seq-len and --microbatch-size; "
            f"missing {', '.join(missing)}"
        )
    for flag, value in (("--costs", costs), ("--comm", comm), ("--stage-multipliers", multipliers), *profiled.items()):
        if value is not None:
            raise ConfigError(f"{flag} cannot be combined with a model description (the model gives the costs)")
    if (memory_limit is not None or limit_bytes is not None) and given["--gpu-memory"] is not None:
        raise ConfigError("give --memory-limit (activations) or --gpu-memory (GB, all of a device), not both")
    dtype = given["--activation-dtype"] if given["--activation-dtype"] is not None else "bf16"  # an empty value is refused below
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"--activation-dtype {dtype!r} is not known: use one of {', '.join(DTYPE_BYTES)}")
    attention = given["--attention"] if given["--attention"] is not None else "flash"
    if attention not in ATTENTION_KERNELS:
        raise ConfigError(f"--attention {attention!r} is not known: use one of {', '.join(ATTENTION_KERNELS)}")
    spec = TransformerSpec(
        given["--layers"], given["--hidden"], given["--seq-len"], microbatch_size,
        heads=given["--heads"], vocab=given["--vocab"], attention=attention, dtype_bytes=DTYPE_BYTES[dtype],
    )
    hardware = Hardware(
        tflops=given["--flops"] if given["--flops"] is not None else DEFAULT_TFLOPS,
        bandwidth=given["--bandwidth"], gpu_memory=given["--gpu-memory"],
    )
    return TransformerCosts(spec, ranks, hardware, limit=memory_limit, memory_bytes=limit_bytes)
