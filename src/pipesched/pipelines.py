"""How a schedule's stages form pipelines (model copies), and how to read that back from a CSV.

A schedule of ``P`` pipelines (DualPipe: 2) cuts its ``S`` stages into ``P`` consecutive runs of
``S/P`` stages; run ``j`` is a whole copy of the model that processes its own contiguous block
of the microbatches, :func:`pipeline_block`. torch's CSV has no field for this, but the actions
show it: every stage of one pipeline runs the same microbatches, and the pipelines' microbatches
are disjoint. :func:`infer_pipelines` reads the count from which microbatches each stage runs, so
that a dualpipe CSV loads back as the two pipelines it was exported from.
"""

from __future__ import annotations

from typing import Sequence

from .errors import CSVFormatError


def pipeline_block(pipeline: int, microbatches: int, pipelines: int) -> range:
    """The microbatches pipeline ``pipeline`` of ``pipelines`` runs, out of ``microbatches``:
    ``[ceil(j*m/P), ceil((j+1)*m/P))``, so the first copies take any extra one."""
    j, m, count = pipeline, microbatches, pipelines
    return range(-(-j * m // count), -(-(j + 1) * m // count))


def infer_pipelines(stage_runs: Sequence[frozenset[int]], microbatches: int) -> int:
    """The number of pipelines whose blocks explain ``stage_runs`` (``stage_runs[s]``: the
    microbatches stage ``s`` has any action for).

    One pipeline unless two stages run disjoint microbatches: in one pipeline every stage runs
    every microbatch, so overlapping sets with a gap are a missing action, which validation names.
    So is a CSV in which every stage runs microbatches of its own: one-stage "pipelines" hand
    nothing on, and a pipeline with actions missing is the likelier reading. Otherwise disjoint
    sets must form equal runs of stages with :func:`pipeline_block`'s blocks in order; anything
    else is refused (CSVFormatError) with which stages run which microbatches.
    """
    if not _some_disjoint(stage_runs):
        return 1
    groups = _runs_of_equal_sets(stage_runs)
    count, stages = len(groups), len(stage_runs)
    if count == stages:
        return 1
    if stages % count == 0 and all(
        len(stage_range) == stages // count and seen == frozenset(pipeline_block(j, microbatches, count))
        for j, (stage_range, seen) in enumerate(groups)
    ):
        return count
    seen = ", ".join(f"{_stages(r)} {'run' if len(r) > 1 else 'runs'} {_numbers(mbs)}" for r, mbs in groups)
    raise CSVFormatError(
        f"the stages run different microbatches, which no split into pipelines explains: {seen} "
        "(P pipelines are P equal runs of consecutive stages, run j running microbatches "
        "ceil(j*m/P) to ceil((j+1)*m/P)-1)"
    )


def _some_disjoint(stage_runs: Sequence[frozenset[int]]) -> bool:
    distinct = list(dict.fromkeys(stage_runs))
    return any(a.isdisjoint(b) for i, a in enumerate(distinct) for b in distinct[i + 1:])


def _runs_of_equal_sets(stage_runs: Sequence[frozenset[int]]) -> list[tuple[range, frozenset[int]]]:
    """Consecutive stages that run the same microbatches, as (stage range, microbatches)."""
    groups: list[tuple[range, frozenset[int]]] = []
    for stage, seen in enumerate(stage_runs):
        if groups and groups[-1][1] == seen:
            groups[-1] = (range(groups[-1][0].start, stage + 1), seen)
        else:
            groups.append((range(stage, stage + 1), seen))
    return groups


def _stages(numbers: range) -> str:
    if len(numbers) == 1:
        return f"stage {numbers.start}"
    return f"stages {numbers.start}-{numbers.stop - 1}"


def _numbers(values: frozenset[int]) -> str:
    """``{0, 1, 2, 5}`` (never empty) as ``0-2,5``."""
    parts: list[str] = []
    ordered = sorted(values)
    start = previous = ordered[0]
    for value in [*ordered[1:], None]:
        if value == previous + 1:
            previous = value
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if value is not None:
            start = previous = value
    return ",".join(parts)
