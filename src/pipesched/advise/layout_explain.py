"""Why a whole layout was picked: what each dimension costs in time and bytes, the runners-up,
and the settings that run it (pipesched's ``train`` and torchtitan's ``--parallelism`` flags)."""

from __future__ import annotations

from typing import Optional

from ..units import format_time
from .estimate import GB
from .layout import LayoutAdvice, LayoutCandidate
from .layout_costs import ALL_TO_ALLS_PER_PASS, TP_COLLECTIVES_PER_PASS, LayoutCosts
from .howto import csv_name, export_command

TORCHTITAN_SCHEDULES = {  # pipesched family -> torch.distributed.pipelining's schedule name
    "gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B", "looped-bfs": "LoopedBFS",
    "interleaved-zb": "InterleavedZeroBubble", "zb-v": "ZBVZeroBubble", "dualpipev": "DualPipeV",
}
RUNNERS_UP = 3
HELD = (("params", "parameters"), ("grads", "gradients"), ("optimizer", "optimizer state"),
        ("gathered", "gathered window"), ("unsharded_grads", "unsharded gradients until REDUCE_GRAD"),
        ("buffers", "FSDP buffers"), ("activations", "activations at peak"))


def _t(ms: float) -> str:
    return format_time(ms, "ms")


def _layout_key(c: LayoutCandidate) -> tuple[int, int, int, int]:
    return c.pp, c.dp, c.dp_shard, c.tp


def layout_name(c: LayoutCandidate) -> str:
    return f"pp {c.pp} x dp {c.dp} x dp_shard {c.dp_shard} x tp {c.tp}"


def runners_up(advice: LayoutAdvice) -> list[LayoutCandidate]:
    """The fastest row of each of the next layouts after the pick's."""
    seen = {_layout_key(advice.recommended)}
    out = []
    for c in advice.candidates:
        if _layout_key(c) not in seen:
            seen.add(_layout_key(c))
            out.append(c)
        if len(out) == RUNNERS_UP:
            break
    return out


def _paced(row: LayoutCandidate) -> str:
    """The bubble's two parts where the ranks' loads differ: the busiest rank's fill and drain,
    and the others waiting for it."""
    paced = row.pipeline_bubble
    if paced is None or row.candidate.bubble_ratio - paced < 0.0005:
        return ""
    return (f" ({100 * paced:.1f}% the busiest rank's fill and drain, the rest the lighter ranks waiting for it)")


def dimension_lines(best: LayoutCandidate, costs: LayoutCosts, tokens_per_step: Optional[int], gpus: int) -> list[str]:
    """What each dimension of ``best`` costs in time and bytes (``costs``: its layout's model)."""
    c = best.candidate
    stages = c.chunks * best.pp
    style = c.placement
    lines = [f"step {_t(best.step_time)}" + (f", {tokens_per_step / (best.step_time / 1e3) / gpus:.4g} tokens/s per GPU"
                                                  if tokens_per_step else "")]
    lines.append(f"pp {best.pp}: {c.schedule} with {c.chunks} chunk(s) and {c.microbatches} microbatches, bubble "
                 f"{100 * c.bubble_ratio:.1f}%" + _paced(best) + (", every stage recomputing its activations" if c.recompute != "none" else ""))
    if best.tp > 1:
        layers = max(r["layers"] for r in costs._ranks_of(stages, style))
        passes = 2 + (c.recompute != "none")  # forward, backward, and the recomputed forward
        per_step = passes * TP_COLLECTIVES_PER_PASS * costs.tp_collective_ms(c.scale) * layers * c.microbatches
        lines.append(f"tp {best.tp}: {2 * TP_COLLECTIVES_PER_PASS} all-reduces per layer and microbatch on the compute lane, "
                     f"about {_t(per_step)} per step on the busiest rank; weights, gradients and activations split {best.tp} ways")
    if best.ep > 1:
        layers = max(r["layers"] for r in costs._ranks_of(stages, style))
        per_step = 2 * ALL_TO_ALLS_PER_PASS * costs.all_to_all_ms(c.scale) * layers * c.microbatches
        hidden = " (dualpipev's pairs hide them behind the other half)" if c.costs.overlap < 1 and c.schedule == "dualpipev" else ""
        lines.append(f"ep {best.ep}: a dispatch and a combine all-to-all per layer in each of F and B, about "
                     f"{_t(per_step)} per step on the busiest rank{hidden}; routed experts split {best.ep} ways")
    if best.dp_shard > 1:
        lines.append(f"dp_shard {best.dp_shard}: all-gathers {_t(best.gather_per_rank)} ({_t(best.exposed_gather)} exposed), "
                     f"reduce-scatters {_t(best.allreduce_per_rank)} ({_t(best.exposed_allreduce)} exposed) on the comm lane; "
                     f"parameters, gradients and optimizer state split {best.dp_shard} ways (memory below)")
    if best.dp > 1 and best.dp_shard == 1:
        lines.append(f"dp {best.dp}: gradient all-reduce {_t(best.allreduce_per_rank)} ({_t(best.exposed_allreduce)} exposed)")
    elif best.dp > 1:
        lines.append(f"dp {best.dp}: replicas all-reduce each shard after its reduce-scatter (counted above)")
    if best.bytes_per_rank:
        lines.append(memory_line(best.bytes_per_rank, on_timeline=best.dp_shard > 1 and best.pp > 1))
    return lines


def memory_line(bytes_per_rank, on_timeline: bool) -> str:
    """The fullest pipeline rank's peak and its bytes of each kind (its fullest shard and tp rank),
    each at its own most; ``on_timeline``: the peak holds each stage's unsharded gradients only
    from its first backward (:mod:`.held_gradients`), so it lies under the parts' sum."""
    rank, held = max(enumerate(bytes_per_rank), key=lambda r: r[1]["peak"])
    parts = ", ".join(f"{label} {held[key] / GB:.3g}" for key, label in HELD if held[key])
    timeline = " (unsharded gradients held from each stage's first B/W)" if on_timeline else ""
    return f"memory: {held['peak'] / GB:.4g} GB on the fullest rank (pipeline rank {rank}){timeline}: {parts} GB"


def runner_lines(advice: LayoutAdvice) -> list[str]:
    best = advice.recommended
    return [f"runner-up {layout_name(c)}: {c.candidate.label()}, {c.step_time / best.step_time:.3f}x the pick's step"
            for c in runners_up(advice)]


def torchtitan_flags(best: LayoutCandidate) -> str:
    """torchtitan's ``--parallelism`` (and checkpointing) flags for ``best``."""
    c = best.candidate
    flags = [f"--parallelism.pipeline_parallel_degree {best.pp}",
             f"--parallelism.data_parallel_replicate_degree {best.dp}",
             f"--parallelism.data_parallel_shard_degree {best.dp_shard}",
             f"--parallelism.tensor_parallel_degree {best.tp}"]
    if best.pp > 1:
        name = TORCHTITAN_SCHEDULES.get(c.schedule)
        flags.append(f"--parallelism.pipeline_parallel_schedule {name}" if name else
                     f"--parallelism.pipeline_parallel_schedule_csv {csv_name(c)}")
        if c.microbatch_size is not None:
            flags.append(f"--parallelism.pipeline_parallel_microbatch_size {c.microbatch_size}")
    if c.recompute != "none":
        flags.append("--activation_checkpoint.mode full")
    return " ".join(flags)


def run_lines(best: LayoutCandidate) -> list[str]:
    """How to run the pick: the schedule, pipesched's train flags, torchtitan's."""
    c = best.candidate
    world = best.pp * best.dp * best.dp_shard * best.tp
    lines = []
    if best.pp > 1:
        lines.append(f"Build it: {export_command(c, best.pp)} -o {csv_name(c)}")
        if c.schedule not in TORCHTITAN_SCHEDULES:
            lines.append(f"  (torchtitan runs {c.schedule} from that file: pipeline_parallel_schedule_csv)")
    lines.append(f"pipesched train: --csv {csv_name(c)} --ranks {best.pp} --dp {best.dp} --dp-shard {best.dp_shard} "
                 f"--tp {best.tp}" + (" --recompute all" if c.recompute != "none" else "") + f" (world {world})")
    lines.append(f"torchtitan: {torchtitan_flags(best)}")
    return lines
