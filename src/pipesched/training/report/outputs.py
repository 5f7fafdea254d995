"""What ``pipesched train`` prints and writes after a run."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from ...render.console import output_console
from ...render.run_figures import bubble_interval, median_step_s
from ...schedule import Schedule


def print_summary(schedule: Optional[Schedule], result, rows: Sequence[dict]) -> None:
    """The run in a few lines: what ran on which layout, its loss from its first step to its
    last, its median step and bubble (the figures of :mod:`pipesched.render.run_figures`, as the
    report shows them: ``rows`` are the report's), the final held-out loss; for a pipeline the
    measured step against the simulator's replay, and memory per rank."""
    from .run_report import run_title

    console = output_console()
    console.print(f"[bold]{run_title(schedule, result.layout, result.dtype)}[/bold]")
    first, last = result.first_step + 1, result.first_step + len(result.losses)
    resumed = f" (resumed after step {result.first_step})" if result.first_step else ""
    median = median_step_s(rows) if rows else result.median_step_time()
    line = (f"loss of step {first} {result.losses[0]:.6f} -> of step {last} {result.losses[-1]:.6f}{resumed}   "
            f"median step {1000 * median:.2f} ms")
    if result.loop and result.loop.evals:
        step, loss = result.loop.evals[-1]
        line += f"   final eval loss {loss:.6f} (after step {step})"
    console.print(line)
    if schedule is None or not result.timelines:
        return
    _print_pipeline(console, schedule, result, rows)
    print_memory(result.memory)


def _print_pipeline(console, schedule: Schedule, result, rows: Sequence[dict]) -> None:
    """The run's bubble, then the measured steps against the simulator's replay of them."""
    from ...runtime.metering.bubble_share import measured_bubble
    from ...runtime.metering.timeline import compare_to_simulation

    interval, what = bubble_interval(rows), "logging interval"
    if interval is None:  # not measured per interval (no --metrics, --tensorboard, --report): per step
        interval, what = bubble_interval([{"step": result.first_step + i + 1, "bubble_share": measured_bubble([t])}
                                          for i, t in enumerate(result.timelines) if t and all(t)]), "step"
    if interval is not None:
        simulated = interval.get("simulated_bubble_share")
        also = f", simulated from its measured costs {100 * simulated:.1f}%" if simulated is not None else ""
        console.print(f"bubble of the median {what} (step {interval['step']}): "
                      f"measured {100 * interval['bubble_share']:.1f}%{also}")
    steps = result.timelines[1:] or result.timelines
    c = compare_to_simulation(schedule, steps, result.comm_latency)
    costs = "  ".join(f"{k} {1000 * v:.3f}" for k, v in c.kind_costs.items())
    console.print(f"median action (ms, per stage): {costs}   p2p latency {1000 * c.comm:.3f} ms")
    console.print(
        f"actions end at {1000 * c.measured_makespan:.2f} ms measured (median step), "
        f"{1000 * c.simulated_makespan:.2f} ms simulated from the median costs: measured/simulated {c.ratio:.3f}"
    )
    console.print(
        f"runtime overhead: measured / replayed with each step's own action times {c.replay_ratio:.3f} "
        "(1.000 = no time lost between actions beyond the p2p latency)"
    )


def print_stopped(rows: Sequence[dict]) -> None:
    """What an interrupted or failed run did up to its last logged step (``rows``: its logging
    intervals), the terminal summary of a run that brought nothing back."""
    if not rows:
        return
    last = rows[-1]
    line = (f"up to step {last['step']}: loss {_loss(rows[0]['loss'])} (interval to step {rows[0]['step']}) -> "
            f"{_loss(last['loss'])} (interval to step {last['step']})   median step {1000 * median_step_s(rows):.2f} ms")
    evals = [r for r in rows if "eval_loss" in r]
    if evals:
        line += f"   last eval loss {evals[-1]['eval_loss']:.6f} (after step {evals[-1]['eval_step']})"
    output_console().print(line)


def _loss(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.6f}"


def print_memory(memory: list) -> None:
    """Per rank: activation bytes measured (most in any step) next to the prediction; the device's
    peak on CUDA."""
    from ...memory import format_bytes

    console = output_console()
    for m in memory:
        line = (f"rank {m.rank}: activations measured {format_bytes(m.measured_peak_activation_bytes)}, "
                f"predicted {format_bytes(m.predicted_peak_activation_bytes)}")
        if m.predicted_peak_activation_bytes:
            line += f" (measured/predicted {m.measured_peak_activation_bytes / m.predicted_peak_activation_bytes:.3f})"
        if m.device_peak_bytes is not None:
            line += (f"   device peak {format_bytes(m.device_peak_bytes)}, "
                     f"of which weights, grads, optimizer at the step's start {format_bytes(m.device_baseline_bytes)}")
        console.print(line)
        if m.state_bytes is not None:
            held, want = (sum(m.state_bytes[k].values()) for k in ("measured", "predicted"))
            console.print(f"rank {m.rank}: parameters, gradients, optimizer state measured {format_bytes(held)}, "
                          f"predicted {format_bytes(want)}" + (f" (measured/predicted {held / want:.3f})" if want else ""))


def summary(schedule: Optional[Schedule], result, rows: Sequence[dict] = ()) -> dict:
    """The run's summary for ``--json`` (stable names: scripts and CI read them); ``rows``: the
    run's logging intervals, whose figures (:mod:`pipesched.render.run_figures`) the terminal and
    the report show too."""
    lay = result.layout
    median = median_step_s(rows) if rows else result.median_step_time()
    out = {
        "schedule": schedule.name if schedule is not None else "none",
        "ranks": schedule.ranks if schedule is not None else 1,
        "dp": result.dp,
        "dp_shard": lay.dp_shard if lay is not None else 1,
        "tp": lay.tp if lay is not None else 1,
        "dtype": result.dtype,
        "microbatches": schedule.microbatches if schedule is not None else 1,
        "losses": list(result.losses),
        "median_step_ms": 1000 * median,
        "memory": [m.summary() for m in result.memory],
        "lrs": list(result.loop.lrs) if result.loop else [],  # the learning rate of each step run
        "evals": [{"step": step, "loss": loss} for step, loss in result.loop.evals] if result.loop else [],
    }
    return {**out, **_bubble(rows)}


def stopped_summary(cfg, rows: Sequence[dict]) -> dict:
    """The ``--summary`` of a run that stopped (``cfg``: its TrainConfig) from its logging
    intervals: :func:`summary`'s names where its metrics file knows them, ``stopped_after_step``,
    and the intervals' loss and learning rate in place of each step's."""
    lay, schedule = cfg.layout, cfg.schedule
    out = {
        "schedule": schedule.name if schedule is not None else "none",
        "ranks": lay.pp, "dp": lay.dp_replicate, "dp_shard": lay.dp_shard, "tp": lay.tp,
        "microbatches": schedule.microbatches if schedule is not None else 1,
        "stopped_after_step": rows[-1]["step"],
        "median_step_ms": 1000 * median_step_s(rows),
        "intervals": [{"step": r["step"], "loss": r["loss"], "lr": r["lr"]} for r in rows],
        "evals": [{"step": r["eval_step"], "loss": r["eval_loss"]} for r in rows if "eval_loss" in r],
    }
    return {**out, **_bubble(rows)}


def _bubble(rows: Sequence[dict]) -> dict:
    """The run's bubble (:func:`~pipesched.render.run_figures.bubble_interval`) as summary fields."""
    interval = bubble_interval(rows)
    if interval is None:
        return {}
    return {"bubble": {"step": interval["step"], "measured": interval["bubble_share"],
                       "simulated": interval.get("simulated_bubble_share")}}


class OutputsLost(RuntimeError):
    """An output of a finished run could not be written where asked (the message says where
    each one was kept instead): the CLI's exit 1."""


def write_outputs(schedule: Optional[Schedule], result, save_params: Optional[Path], trace: Optional[Path],
                  json_path: Optional[Path] = None, checkpoint: Optional[str] = None, rows: Sequence[dict] = ()) -> None:
    """Write the run's outputs. One that cannot be written (a full disk, its folder removed
    during the run) is kept in a temporary file instead, and after trying every output
    :class:`OutputsLost` says, in one line, what failed and where each one is (``checkpoint``,
    the run's newest checkpoint, holds the trained weights too)."""
    lost: list[str] = []
    if json_path is not None:
        from ...jsontext import json_text

        text = json_text(summary(schedule, result, rows), indent=1)
        if _write(json_path, lambda path: _atomic(path, text), "", lost):
            print(f"wrote {json_path} (run summary)")
    if save_params is not None:
        import io

        import torch

        buffer = io.BytesIO()
        torch.save(result.params, buffer)
        also = f" ({checkpoint} holds the same weights)" if checkpoint else ""
        if _write(save_params, lambda path: _atomic(path, buffer.getvalue()), also, lost):
            print(f"wrote {save_params} ({len(result.params)} tensors)")
    if trace is not None:
        if schedule is None:
            print("no timeline for the reference run (--trace needs a schedule)")
        else:
            from ...runtime.metering.timeline import write_trace

            drawn: list[int] = []
            if _write(trace, lambda path: drawn.append(write_trace(path, schedule, result.timelines, result.memory_curves)),
                      "", lost):
                print(f"wrote {trace} (Perfetto trace of step {drawn[0]}, the median, activation bytes per rank; "
                      "every step in otherData)")
    if lost:
        raise OutputsLost("the run finished, but " + "; ".join(lost))


def _atomic(path: Path, data) -> None:
    from ...outfiles import write_atomic

    write_atomic(path, data)


def _write(path: Path, write, note: str, lost: list[str]) -> bool:
    """``write(path)``; if it fails, ``write`` to a temporary file instead and add to ``lost``
    a line saying why and where the output is kept (and ``note``). Returns whether ``path``
    was written."""
    import os
    import tempfile

    from ...errors import ConfigError

    try:
        write(path)
        return True
    except (OSError, ConfigError) as err:
        why = _why(err)
    try:
        fd, kept = tempfile.mkstemp(prefix=f"pipesched-{path.stem}-", suffix=path.suffix)
        os.close(fd)
        write(Path(kept))
        where = f"kept in {kept} instead"
    except (OSError, ConfigError) as err:
        where = f"not kept in a temporary file either ({_why(err)})"
    lost.append(f"could not write {path} ({why}): {where}{note}")
    return False


def _why(err: Exception) -> str:
    if isinstance(err, OSError):
        return err.strerror or type(err).__name__
    return str(err).split(": ", 1)[-1]
