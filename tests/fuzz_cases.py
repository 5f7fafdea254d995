"""Generated hostile input for pipesched's commands, and the batch runner that tries it.

Shared by ``tests/test_cli_fuzz.py`` (a bounded run in the suite) and ``benchmarks/fuzz.py``
(the counts in benchmarks/RESULTS.md). A case is a command line: extreme values of one numeric or
text option, or a generated schedule CSV. Cases run in batches: one subprocess imports
pipesched once and calls the console script's entry point (``pipesched.cli.main``) for each,
with stdout and stderr captured per case, a time bound per case (SIGALRM) and a cap on memory
(RLIMIT_AS). What must hold for every case (:func:`problems`): exit status 2 with one
``pipesched: error:`` line (after click's usage block for usage errors), or exit 0 with strict
JSON where ``--json`` asked for it; never a traceback, a message over :data:`MAX_MESSAGE`
characters, or a run past its bound.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from hypothesis import strategies as st

from conftest import cli_env

BOUND_S = 20.0  # per case; a refusal takes milliseconds once pipesched is imported
MEMORY_CAP = 3 << 30  # bytes of address space for a batch
MAX_MESSAGE = 2000  # characters on stderr for one case

INTS = ["0", "-1", "1.5", "nan", "", str(2**63), "9" * 30, "1" * 5000, "0x10"]
FLOATS = ["nan", "inf", "-inf", "-1", "0", "1e308", "-1e308", "1e-320", "1e400", "1e9", "1e-6", "", "1e12", "abc"]
SIZES = ["1e308", "1e300GiB", "-1MiB", "0", "nan", "", "1024TiB", "1025TiB", "1PiB", "1e-320B"]

PLANNING_INTS = ["--ranks", "--microbatches", "--chunks"]
PLANNING_FLOATS = ["--comm", "--overlap", "--recompute-input"]
PLANNING_LISTS = ["--costs", "--stage-multipliers", "--memory-limit"]
# command prefix -> its options that take numbers (ints, floats) or lists of them
COMMANDS: dict[str, tuple[list[str], list[str], list[str]]] = {
    "simulate 1f1b -p 2 -m 2 --json": (PLANNING_INTS, PLANNING_FLOATS, PLANNING_LISTS + ["--activation-bytes", "--activation-limit"]),
    "simulate zb-v -p 2 -m 4 --json": (PLANNING_INTS, PLANNING_FLOATS, PLANNING_LISTS + ["--activation-bytes", "--activation-limit"]),
    "export zb-h1 -p 2 -m 2": (PLANNING_INTS + ["--microbatch-size"], ["--recompute-input"], PLANNING_LISTS),
    "draw 1f1b -p 2 -m 2 -o {dir}/fuzz.svg": (PLANNING_INTS, PLANNING_FLOATS, PLANNING_LISTS),
    "compare -p 2 -m 2 --json": (PLANNING_INTS, PLANNING_FLOATS, PLANNING_LISTS),
    "advise -p 2 -m 4 --max-chunks 2 --json": (
        ["--ranks", "--microbatches", "--max-chunks", "--workers", "--top", "--global-batch", "--max-microbatches",
         "--min-microbatch-size", "--microbatch-size"],
        ["--comm", "--overhead"], ["--costs", "--stage-multipliers", "--memory-limit"]),
    "advise --gpus 4 --layers 4 --hidden 64 --seq-len 64 --microbatch-size 1 --global-batch 8 --bandwidth 10 --max-chunks 1 --json": (
        ["--gpus", "--layers", "--hidden", "--seq-len", "--heads", "--vocab", "--global-batch", "--microbatch-size"],
        ["--dp-bandwidth", "--dp-latency", "--bandwidth", "--flops", "--gpu-memory"], []),
}


class Outcome(NamedTuple):
    argv: list[str]
    code: object  # the exit status, or "overrun" / "memory" / "raised <type>"
    stdout: str
    stderr: str
    seconds: float


@st.composite
def option_case(draw) -> list[str]:
    """One command with an extreme value of one of its numeric options."""
    prefix = draw(st.sampled_from(sorted(COMMANDS)))
    ints, floats, lists = COMMANDS[prefix]
    kind = draw(st.sampled_from([k for k, names in (("int", ints), ("float", floats), ("list", lists)) if names]))
    if kind == "int":
        flag, value = draw(st.sampled_from(ints)), draw(st.sampled_from(INTS))
    elif kind == "float":
        flag, value = draw(st.sampled_from(floats)), draw(st.sampled_from(FLOATS))
    else:
        flag = draw(st.sampled_from(lists))
        pool = SIZES if flag in ("--memory-limit", "--activation-bytes", "--activation-limit") else FLOATS
        value = ",".join(draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4)))
    return prefix.split() + [f"{flag}={value}"]


_INDEX = st.one_of(st.integers(0, 3), st.sampled_from([str(2**63), str(10**12), str(10**7), "9" * 5000, "007"]))
_CELL = st.one_of(
    st.builds("{}{}{}".format, _INDEX, st.sampled_from("FIWBFX"), _INDEX),
    st.builds("({};{})OVERLAP_F_B".format, st.builds("{}F{}".format, _INDEX, _INDEX),
              st.builds("{}{}{}".format, _INDEX, st.sampled_from("BIF"), _INDEX)),
    st.text(alphabet=",;()\"' \t0123456789FIWBX_\r\n", max_size=12),
    st.just(""), st.just("1" * 131_073),
)
_VALID = ["0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", "0F0,0I0,0W0\n", "0F0,1F0,1I0,0I0,1W0,0W0\n,,,,,\n"]


@st.composite
def csv_case(draw) -> bytes:
    """A schedule CSV: rows of generated cells, or a valid one with a cell dropped, changed or
    repeated; any line ends, sometimes a byte-order mark or bytes that are not UTF-8."""
    if draw(st.booleans()):
        rows = [line.split(",") for line in draw(st.sampled_from(_VALID)).splitlines()]
        r = draw(st.integers(0, len(rows) - 1))
        c = draw(st.integers(0, len(rows[r]) - 1))
        how = draw(st.sampled_from(["drop", "change", "repeat", "keep"]))
        if how == "drop":
            del rows[r][c]
        elif how == "change":
            rows[r][c] = draw(_CELL)
        elif how == "repeat":
            rows[r].insert(c, rows[r][c])
    else:
        rows = draw(st.lists(st.lists(_CELL, max_size=6), max_size=4))
    ending = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    text = draw(st.sampled_from(["", "\ufeff"])) + ending.join(",".join(row) for row in rows) + ending
    data = text.encode()
    return data + b"\xff\xfe" if draw(st.integers(0, 9)) == 0 else data


_RUNNER = r"""
import contextlib, faulthandler, io, json, resource, signal, sys, time, traceback
faulthandler.enable()  # a crash of the runner itself (a signal) shows where it happened
cases, bound, cap, warm = json.loads(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
from pipesched.cli import main
import importlib
for module in warm:  # imported before any case is timed: the bound is each case's own work
    importlib.import_module(module)

class Overrun(BaseException):
    pass

def stop(*_):
    raise Overrun()

signal.signal(signal.SIGALRM, stop)
done = []
for argv in cases:
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, bound)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(argv)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except Overrun:
        code = "overrun"
    except MemoryError:
        code = "memory"
    except BaseException as raised:
        code = "raised " + type(raised).__name__
        err.write(traceback.format_exc())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    done.append([code, out.getvalue()[:20000], err.getvalue()[:20000], time.monotonic() - start])
print(json.dumps(done))
"""


def run_batch(cases: list[list[str]], cwd: Path, bound_s: float = BOUND_S, warm: tuple[str, ...] = ()) -> list[Outcome]:
    """Run ``cases`` (argv lists, ``{dir}`` standing for ``cwd``) in one subprocess; their outcomes.
    ``warm``: modules imported before the first case is timed (torch and transformers take
    seconds to import, which would count against the first case's bound on a loaded machine)."""
    argvs = [[arg.replace("{dir}", str(cwd)) for arg in argv] for argv in cases]
    done = subprocess.run(
        [sys.executable, "-c", _RUNNER, json.dumps(argvs), str(bound_s), str(MEMORY_CAP), json.dumps(list(warm))],
        capture_output=True, text=True, env=cli_env(), cwd=cwd, timeout=bound_s * len(cases) + 120,
    )
    if done.returncode != 0:
        raise AssertionError(f"the batch runner failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return [Outcome(argv, *row) for argv, row in zip(argvs, json.loads(done.stdout))]


def problems(outcome: Outcome) -> list[str]:
    """What is wrong with one case's outcome (empty: nothing)."""
    found = []
    code, out, err = outcome.code, outcome.stdout, outcome.stderr
    if code not in (0, 2):
        found.append(f"exit status {code!r}, not 0 or 2")
    if "Traceback" in err:
        found.append("a traceback")
    if len(err) > MAX_MESSAGE:
        found.append(f"{len(err)} characters on stderr")
    if outcome.seconds > BOUND_S:
        found.append(f"ran {outcome.seconds:.1f} s")
    if code == 2:
        lines = err.rstrip("\n").splitlines()
        usage = len(lines) == 3 and lines[0].startswith("Usage: pipesched") and lines[1].startswith("Try '")
        if out or not (len(lines) == 1 or usage) or not lines[-1].startswith("pipesched: error: "):
            found.append("not one 'pipesched: error:' line on stderr and nothing on stdout")
    if code == 0 and "--json" in outcome.argv:
        try:
            json.loads(out, parse_constant=lambda token: (_ for _ in ()).throw(ValueError(token)))
        except ValueError as err_:
            found.append(f"stdout is not strict JSON ({err_})")
    return [f"pipesched {' '.join(a[:80] for a in outcome.argv)}: {p}\n    stderr: {err[-400:]!r}" for p in found]


def csv_cases(files: list[bytes], folder: Path) -> list[list[str]]:
    """Write each CSV into ``folder``; a command per file (simulate, or draw every third)."""
    cases = []
    for i, data in enumerate(files):
        path = folder / f"fuzz-{i}.csv"
        path.write_bytes(data)
        cases.append(["draw", "--csv", str(path), "-o", str(folder / "fuzz.svg")] if i % 3 == 2
                     else ["simulate", "--csv", str(path), "--json"])
    return cases
