"""Schedule CSV files in torch's two formats, written and read: ``compute_only`` and ``compute_comms``.

``compute_only`` (the default; :meth:`Schedule.to_csv`) holds each rank's compute actions, one
row per rank. ``compute_comms`` holds each rank's lowered program (:mod:`pipesched.runtime.program.program`):
the same actions with ``SEND_F``/``RECV_F``/``SEND_B``/``RECV_B``, ``REDUCE_GRAD`` and FSDP's
``UNSHARD``/``RESHARD`` cells,
no empty cell, as ``torch.distributed.pipelining``'s ``_PipelineScheduleRuntime._dump_csv``
writes it and its ``_load_csv(..., format="compute_comms")`` runs it as written.

Reading tells the formats apart by their cells. A ``compute_comms`` file's compute cells are
its schedule; its communication must be that schedule's (every message sent after the action
computing it, received once, in its link's order, before the action using it; each stage
reduced once after its last gradient) and must not be able to hang
(:func:`~pipesched.runtime.program.program_check.check_programs`), or the file is refused naming what
is wrong. ``UNSHARD``/``RESHARD`` cells name a stage of their rank, as ``REDUCE_GRAD`` does,
and the schedule read carries where they are (:attr:`Schedule.gathers`; in a ``compute_only``
file too, checked the same way): pipesched's runtime
gathers there, as torch's does; its messages and reductions are pipesched's own lowering of the
schedule, which for a file it wrote, or torch wrote without ``defer_pp_recv``, is the file's.
A file without ``UNSHARD``/``RESHARD`` cells gathers by the lowering's window.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Optional, Sequence

from .actions import MAX_INDEX_DIGITS, Action, Overlap, parse_slot, shown
from .errors import ConfigError, CSVFormatError, ScheduleError
from .ops import Op
from .planning import MAX_ACTIONS_BUILT
from .runtime.program.instructions import RankProgram
from .runtime.program.program import assemble, lower_all, placing_gathers
from .runtime.program.program_check import check_programs, gathered_peak
from .schedule import Schedule, csv_rows
from .validate import validate

FORMATS = ("compute_only", "compute_comms")  # torch's names
_COMM_RE = re.compile(r"^\s*([0-9]+)(SEND_F|RECV_F|SEND_B|RECV_B|REDUCE_GRAD|UNSHARD|RESHARD)([0-9]*)\s*$")
_STAGE_OPS = frozenset(("REDUCE_GRAD", "UNSHARD", "RESHARD"))  # name a stage, no microbatch
_TRANSFERS = frozenset(("SEND_F", "RECV_F", "SEND_B", "RECV_B"))


def check_format(format: str) -> str:
    """``format`` if it is one of :data:`FORMATS`, else a ConfigError naming them."""
    if format not in FORMATS:
        raise ConfigError(f"--format {format!r} is not known: use one of {', '.join(FORMATS)}")
    return format


def csv_text(schedule: Schedule, format: str = "compute_only",
             programs: Optional[Sequence[RankProgram]] = None) -> str:
    """The schedule as a CSV in ``format`` (one of :data:`FORMATS`), as torch's csv.writer writes.
    ``programs``: the ranks' programs to write in ``compute_comms`` (default: the lowering's, with
    torch's window of 3; :func:`~pipesched.runtime.program.planned_gathers.plan_programs` places
    the gathers from the costs)."""
    if check_format(format) == "compute_only":
        if programs is not None:
            raise ConfigError("a compute_only CSV holds no programs: write them with format compute_comms")
        return schedule.to_csv()
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    for program in (lower_all(validate(schedule)) if programs is None else programs):
        writer.writerow(program.cells())
    return buffer.getvalue()


def parse_csv(text: str, name: str = "csv") -> Schedule:
    """A schedule from CSV text of either format: a file with a SEND or RECV cell is a program
    (checked); elsewhere REDUCE_GRAD cells compute nothing and are dropped (torch's order of a
    single-stage schedule holds them: the lowering places its own), while UNSHARD and RESHARD
    cells, checked as a program's are, stay where the file puts them (:attr:`Schedule.gathers`)."""
    rows = csv_rows(text)
    ops = {match.group(2) for row in rows for cell in row if (match := _COMM_RE.match(cell))}
    if ops & _TRANSFERS:
        return _from_program_rows(rows, name)
    if ops:
        buffer = io.StringIO()
        csv.writer(buffer).writerows([[cell for cell in row if not _COMM_RE.match(cell)] for row in rows])
        text = buffer.getvalue()
    schedule = Schedule.from_csv(text, name=name)
    return _with_gathers(rows, schedule) if ops else schedule


def _from_program_rows(rows: list[list[str]], name: str) -> Schedule:
    while rows and not any(cell.strip() for cell in rows[-1]):
        rows.pop()
    steps = [[step for col, cell in enumerate(row) if (step := _step(cell, _where(r, col)))] for r, row in enumerate(rows)]
    schedule = Schedule.from_orders([[s for s in row if isinstance(s, (Action, Overlap))] for row in steps], name=name)
    return _checked_program(schedule, steps)


def _where(row: int, col: int) -> str:
    return f"row {row + 1} (rank {row}), cell {col + 1}"


def _with_gathers(rows: list[list[str]], schedule: Schedule) -> Schedule:
    """``schedule`` (a compute-only file's actions) carrying the file's UNSHARD/RESHARD cells where
    they stand. Each rank's row is first checked as a program's would be: every cell by
    :func:`_step`'s and :func:`assemble`'s rules (a stage of its rank), and its gathers by
    :func:`gathered_peak`'s (each stage computed only while gathered)."""
    programs = []
    for r, row in enumerate(rows):
        steps = [step for col, cell in enumerate(row) if (step := _step(cell, _where(r, col)))]
        try:
            program = assemble(schedule, r, steps)
            gathered_peak(program, {})
        except ScheduleError as err:
            raise CSVFormatError(f"{err}") from None
        programs.append(program)
    return placing_gathers(schedule, programs)


def _step(cell: str, where: str):
    """A cell of a program: a compute entry, ``(op, stage, microbatch)``, or None (empty)."""
    match = _COMM_RE.match(cell)
    if match is None:
        if not cell.strip():
            return None
        try:
            return parse_slot(cell)
        except CSVFormatError as err:
            raise CSVFormatError(f"{where}: {err}") from None
    stage, op, mb = match.groups()
    for what, digits in (("stage", stage), ("microbatch", mb)):
        if len(digits.lstrip("0")) > MAX_INDEX_DIGITS:
            raise CSVFormatError(f"{where}: {shown(cell)}: the {what} number has {len(digits.lstrip('0'))} digits; "
                                 f"stages and microbatches are numbered below 10**{MAX_INDEX_DIGITS}")
    if (op in _STAGE_OPS) != (mb == ""):
        needs = f"names a stage and no microbatch, e.g. 0{op}" if mb else f"needs a microbatch, e.g. 0{op}1"
        raise CSVFormatError(f"{where}: {shown(cell)}: {op} {needs}")
    return (Op(op), int(stage), int(mb) if mb else None)


def _checked_program(schedule: Schedule, steps: list[list]) -> Schedule:
    """``schedule`` once the communication ``steps`` spell is checked to be its own, carrying
    the gathers they place."""
    validate(schedule)
    try:
        programs = [assemble(schedule, r, row) for r, row in enumerate(steps)]
        check_programs(programs)
    except ScheduleError as err:
        raise CSVFormatError(f"the compute_comms CSV's communication is not its schedule's: {err}") from None
    return placing_gathers(schedule, programs)


def load_csv_file(path: Path, ranks: Optional[int] = None) -> Schedule:
    """Read and parse a schedule CSV of either format (UTF-8, a byte-order mark allowed); a file
    that is missing, a folder, unreadable or not UTF-8, or a wrong rank count, is a ConfigError."""
    if path.is_dir():
        raise ConfigError(f"schedule CSV {str(path)!r} is a folder: give the CSV file inside it")
    if not path.exists():
        raise ConfigError(f"schedule CSV {str(path)!r} does not exist")
    if not path.is_file():
        raise ConfigError(f"schedule CSV {str(path)!r} is not a regular file")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"schedule CSV {str(path)!r} cannot be read ({err.strerror})") from None
    cells = data.count(b",") + data.count(b"\n") + data.count(b"\r")  # every action is a cell: an upper bound
    if cells > MAX_ACTIONS_BUILT:
        raise ConfigError(
            f"schedule CSV {str(path)!r} holds up to {cells} actions, more than the "
            f"{MAX_ACTIONS_BUILT} planned within about a minute: export it with fewer microbatches"
        )
    try:
        text = data.decode("utf-8-sig")  # torch writes UTF-8; Excel and others prefix a BOM
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"schedule CSV {str(path)!r} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
            f"{err.start}): save it as UTF-8"
        ) from None
    schedule = parse_csv(text, name=path.stem)
    if ranks is not None and schedule.ranks != ranks:
        raise ConfigError(f"{path} holds {schedule.ranks} ranks, but --ranks is {ranks}")
    return schedule
