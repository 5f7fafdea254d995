"""Why the advisor recommends what it does, in the guide's terms and with the simulated numbers.

The reason names what bubble the schedule removes and what it costs in memory or messages; the
notes cover the special cases: few microbatches, the guide's default (1F1B) being beaten or not
fitting, a simpler schedule within a whisker, and how the microbatch count was chosen.
"""

from __future__ import annotations

from typing import Optional

from ..errors import UnknownScheduleError
from ..execution import TOLERANCE
from ..memory import format_bytes
from ..registry import get_family
from ..units import format_time
from .result import Advice, Candidate

NEAR = 0.01  # a simpler schedule this close (relative) to the best is worth a note

def why(c: Candidate, ranks: int) -> str:
    """One clause: what this candidate's family removes and what it costs."""
    try:
        family = get_family(c.schedule)
        template = family.why or family.summary  # each family carries its own explanation
    except UnknownScheduleError:
        template = c.schedule
    text = template.format(v=c.chunks, msg=_message_ratio(c, ranks), p=ranks)
    if c.peak_memory_reference < 0.9 * ranks:
        text += f"; here it holds {memory_text(c)} per rank, {c.peak_memory_reference / ranks:.0%} of 1F1B's p"
    return text


def explain(advice: Advice) -> tuple[str, list[str]]:
    """The 1-2 sentence reason and the notes for ``advice``."""
    best, base, p = advice.recommended, advice.baseline, advice.ranks
    unit = advice.objective
    fitting = advice.fitting

    def t(c: Candidate) -> str:
        return format_time(c.value(unit), advice.time_unit)

    if base is not None and base.schedule == best.schedule and base.microbatches == best.microbatches:
        reason = (
            f"{best.label()} is the fastest schedule within the limit ({unit} {t(best)}): "
            f"{why(best, p)}."
        )
        faster = _fastest_over_limit(advice, best)
        if faster is not None:
            reason += (
                f" {faster.label()} would be {best.value(unit) / faster.value(unit):.2f}x faster but needs "
                f"{memory_text(faster)} per rank, above the limit."
            )
    else:
        versus = (
            f" vs {t(base)} for 1F1B at m={base.microbatches} ({best.speedup_vs_1f1b:.2f}x)"
            if base is not None else ""
        )
        reason = (
            f"{best.label()} is the fastest schedule within the limit ({unit} {t(best)}{versus}): "
            f"{why(best, p)}."
        )
    notes = []
    note = _few_microbatches(best, p)
    if note:
        notes.append(note)
    note = _guide_default(advice)
    if note:
        notes.append(note)
    note = _simpler_alternative(fitting, best, unit, p)
    if note:
        notes.append(note)
    note = _microbatch_choice(advice)
    if note:
        notes.append(note)
    if advice.memory_limit is None and not any(c.limit is not None for c in advice.candidates):
        notes.append("No memory limit was given, so every candidate counts as fitting; "
                     "pass --memory-limit (or --gpu-memory) to rule out the memory-hungry ones.")
    return reason, notes


def _message_ratio(c: Candidate, ranks: int) -> str:
    if ranks <= 1:
        return "1"
    ratio = c.messages / (ranks - 1)
    return f"{ratio:.0f}" if abs(ratio - round(ratio)) < 0.05 else f"{ratio:.1f}"


def _fastest_over_limit(advice: Advice, best: Candidate) -> Optional[Candidate]:
    unit = advice.objective
    over = [c for c in advice.candidates if not c.fits and c.value(unit) < best.value(unit) * (1 - TOLERANCE)]
    return min(over, key=lambda c: c.value(unit)) if over else None


def _few_microbatches(best: Candidate, ranks: int) -> str:
    if best.microbatches > ranks:
        return ""
    return (
        f"Only m={best.microbatches} microbatches on p={ranks} ranks: the pipeline never fills, so "
        f"every schedule keeps a bubble (here {100 * best.bubble_ratio:.0f}%); more microbatches "
        "(a larger global batch or smaller microbatches) would shrink it."
    )


def _guide_default(advice: Advice) -> str:
    best, base, unit = advice.recommended, advice.baseline, advice.objective
    if base is None or base is best or (base.schedule == best.schedule and base.microbatches == best.microbatches):
        return ""
    if not base.fits:
        return (
            f"The guide's default, 1F1B, needs {memory_text(base)} per rank at "
            f"m={base.microbatches}, above the limit; the recommendation fits with "
            f"{memory_text(best)}."
        )
    gain = 100 * (base.value(unit) / best.value(unit) - 1)
    if gain < 0.05:
        return ""
    return (
        f"The guide's default, 1F1B, fits (peak {memory_text(base)}) but is "
        f"{gain:.1f}% slower: its bubble is {100 * base.bubble_ratio:.1f}% against "
        f"{100 * best.bubble_ratio:.1f}% here."
    )


def _simpler_alternative(fitting: list[Candidate], best: Candidate, unit: str, ranks: int) -> str:
    for alt in fitting[1:]:
        if alt.value(unit) > best.value(unit) * (1 + NEAR):
            break
        savings = []
        if alt.peak_memory_reference < 0.9 * best.peak_memory_reference:
            savings.append(f"{memory_text(alt)} per rank instead of {memory_text(best)}")
        if alt.messages < best.messages:
            savings.append(f"{alt.messages} instead of {best.messages} cross-rank transfers per microbatch")
        if savings:
            slower = 100 * (alt.value(unit) / best.value(unit) - 1)
            return (
                f"{alt.label()} is only {slower:.1f}% slower and needs {' and '.join(savings)}; prefer it "
                "if memory headroom or point-to-point bandwidth is tighter than modelled."
            )
    return ""


def memory_text(c: Candidate) -> str:
    """Peak activations in M_B units of the reference microbatch, plus bytes when known: the
    device's whole use in GB (weights, gradients and optimizer state with the activations,
    :data:`WHOLE_DEVICE`), else the activations' bytes."""
    if c.recompute != "none" and c.peak_memory_bytes is not None:  # M_B counts stored activations
        return f"{c.memory_gb:.1f} GB {WHOLE_DEVICE}" if c.memory_gb is not None else format_bytes(c.peak_memory_bytes)
    text = f"{c.peak_memory_reference:.3g} M_B"
    if c.memory_gb is not None:
        return text + f" ({c.memory_gb:.1f} GB {WHOLE_DEVICE})"
    return text + (f" ({format_bytes(c.peak_memory_bytes)})" if c.peak_memory_bytes is not None else "")


WHOLE_DEVICE = "in all"  # what the GB in memory_text count: the device's whole use, not activations only


def _microbatch_choice(advice: Advice) -> str:
    options = advice.plan.options
    if len(options) <= 1:
        return ""
    best = advice.recommended
    size = f" of {best.microbatch_size} sample{'s' if best.microbatch_size != 1 else ''}" if best.microbatch_size else ""
    text = (
        f"Microbatches: {best.microbatches}{size} each, out of {len(options)} counts tried "
        f"({', '.join(str(m) for m in options)}), each for the same global batch."
    )
    if best.microbatches == options[-1]:
        text += (
            " Costs scale with microbatch size, so more, smaller microbatches always shrink the bubble "
            "in this model; if small microbatches run less efficiently, pass --overhead or "
            "--min-microbatch-size."
        )
    return text
