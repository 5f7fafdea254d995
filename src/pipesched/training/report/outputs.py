"""What ``pipesched train`` prints and writes after a run."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from rich.console import Console

from ...schedule import Schedule


def print_summary(schedule: Optional[Schedule], result) -> None:
    """Loss, median step time, and for a pipeline the measured bubble against the simulator's."""
    console = Console(stderr=False)
    name = schedule.describe() if schedule is not None else "reference (one process, no pipeline)"
    console.print(f"[bold]{name}[/bold]")
    resumed = f"   (resumed after step {result.first_step})" if result.first_step else ""
    console.print(
        f"loss {result.losses[0]:.6f} -> {result.losses[-1]:.6f}   "
        f"median step {1000 * result.median_step_time():.2f} ms (steps after the first){resumed}"
    )
    if schedule is None or not result.timelines:
        return
    from ...runtime.metering.timeline import compare_to_simulation

    steps = result.timelines[1:] or result.timelines
    c = compare_to_simulation(schedule, steps, result.comm_latency)
    costs = "  ".join(f"{k} {1000 * v:.3f}" for k, v in c.kind_costs.items())
    console.print(f"median action (ms, per stage): {costs}   p2p latency {1000 * c.comm:.3f} ms")
    console.print(
        f"measured: actions end at {1000 * c.measured_makespan:.2f} ms, bubble {100 * c.measured_bubble:.1f}%   "
        f"simulated from measured costs: {1000 * c.simulated_makespan:.2f} ms, bubble {100 * c.simulated_bubble:.1f}%   "
        f"measured/simulated {c.ratio:.3f}"
    )
    console.print(
        f"runtime overhead: measured / replayed with each step's own action times {c.replay_ratio:.3f} "
        "(1.000 = no time lost between actions beyond the p2p latency)"
    )
    print_memory(result.memory)


def print_memory(memory: list) -> None:
    """Per rank: activation bytes measured (most in any step) next to the prediction; the device's
    peak on CUDA."""
    from ...memory import format_bytes

    console = Console(stderr=False)
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


def summary(schedule: Optional[Schedule], result) -> dict:
    """The run's summary for ``--json`` (stable names: scripts and CI read them)."""
    return {
        "schedule": schedule.name if schedule is not None else "none",
        "ranks": schedule.ranks if schedule is not None else 1,
        "dp": result.dp,
        "dtype": result.dtype,
        "microbatches": schedule.microbatches if schedule is not None else 1,
        "losses": list(result.losses),
        "median_step_ms": 1000 * result.median_step_time(),
        "memory": [m.summary() for m in result.memory],
        "lrs": list(result.loop.lrs) if result.loop else [],  # the learning rate of each step run
        "evals": [{"step": step, "loss": loss} for step, loss in result.loop.evals] if result.loop else [],
    }


class OutputsLost(RuntimeError):
    """An output of a finished run could not be written where asked (the message says where
    each one was kept instead): the CLI's exit 1."""


def write_outputs(schedule: Optional[Schedule], result, save_params: Optional[Path], trace: Optional[Path],
                  json_path: Optional[Path] = None, checkpoint: Optional[str] = None) -> None:
    """Write the run's outputs. One that cannot be written (a full disk, its folder removed
    during the run) is kept in a temporary file instead, and after trying every output
    :class:`OutputsLost` says, in one line, what failed and where each one is (``checkpoint``,
    the run's newest checkpoint, holds the trained weights too)."""
    lost: list[str] = []
    if json_path is not None:
        from ...jsontext import json_text

        text = json_text(summary(schedule, result), indent=1)
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
