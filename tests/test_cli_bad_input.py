"""Bad input to the installed ``pipesched`` console script: a short message, exit status 2.

Every row below runs the console script that ``pip install`` put next to the interpreter (not
``python -m``), as a user would, with this checkout's ``src`` on PYTHONPATH. For each one the
command must exit with status 2, print nothing on stdout, print no traceback, and say what is
wrong in one line ``pipesched: error: ...`` -- after click's usage block (``Usage: ...`` and
``Try '... --help' for help.``) for usage errors -- that mentions the given words.

The commands run concurrently in a thread pool (each pays Python's and typer's start-up), so the
whole table takes seconds, not minutes. Nothing may be computed before a bad output path is
refused: the rows that pair a bad path with a plan too large to make would take minutes
otherwise, and the guard on planning size is itself tested by rows that must refuse at once.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_env, concurrently

SCRIPT = Path(sys.executable).with_name("pipesched")
# a refusal takes a second; a row that started the planning it should refuse would run for
# minutes and time out here
REFUSED_WITHIN_S = 60
HAS_TORCH = importlib.util.find_spec("torch") is not None

# {dir}: an existing folder; {file}: an existing plain file; {csv}: a valid schedule CSV;
# {latin1}: a CSV that is not UTF-8; {empty}: an empty CSV; {badcell}: a CSV with a bad action.
BAD_INPUTS: list[tuple[str, str]] = [
    # the command line itself
    ("frobnicate", "No such command 'frobnicate'"),
    ("--frobnicate", "No such option: --frobnicate"),
    ("list --frobnicate", "No such option: --frobnicate"),
    ("list extra", "unexpected extra argument"),
    # export
    ("export", "Missing argument"),
    ("export zb-vv", "unknown schedule 'zb-vv'; did you mean zb-v"),
    ("export 1f1b -p four", "'--ranks' / '-p'"),
    ("export 1f1b -p 0", "--ranks must be at least 1, got 0"),
    ("export 1f1b -m 8.5", "'--microbatches' / '-m'"),
    ("export 1f1b -o", "requires an argument"),
    ("export 1f1b -o out.txt", "the suffix must be one of .csv"),
    ("export 1f1b -o {dir}", "it is a folder"),
    ("export 1f1b -o {dir}/missing/x.csv", "does not exist"),
    ("export 1f1b -o {file}/x.csv", "is not a folder"),
    ("export 1f1b -o /proc/x.csv", "does not accept new files"),
    ("export 1f1b --costs 1,2", "expected three numbers F,B,W"),
    ("export 1f1b --costs 1,x,1", "expected three numbers F,B,W"),
    ("export interleaved-1f1b -v 1", "chunks=1 is plain 1f1b"),
    ("export zb-v --memory-limit 0", "--memory-limit must be a finite number above 0"),
    ("export 1f1b --memory-limit nan", "--memory-limit 'nan' is not a size"),
    ("export zb-auto --objective fastest", "objective 'fastest' is not known"),
    ("export 1f1b --stage-multipliers a,b", "--stage-multipliers 'a,b'"),
    ("export zb-auto -p 256 -m 4096 -o /proc/x.csv", "does not accept new files"),
    # simulate
    ("simulate 1f1b -p four", "'--ranks' / '-p'"),
    ("simulate 1f1b -m 8.5", "'--microbatches' / '-m'"),
    ("simulate 1f1b --frobnicate", "No such option: --frobnicate"),
    ("simulate 1f1b -p -3", "--ranks must be at least 1"),
    ("simulate 1f1b --comm abc", "'--comm'"),
    ("simulate", "give a schedule name or --csv FILE"),
    ("simulate 1f1b --csv {csv}", "one of the two"),
    ("simulate --csv {dir}/missing.csv", "does not exist"),
    ("simulate --csv {dir}", "is a folder"),
    ("simulate --csv {latin1}", "is not UTF-8 text (byte 0xe9"),
    ("simulate --csv {empty}", "the schedule CSV is empty"),
    ("simulate --csv {badcell}", "row 1 (rank 0), cell 2"),
    ("simulate --csv /dev/null", "is not a regular file"),
    ("simulate 1f1b --json --draw", "give one of them"),
    ("simulate zb-auto -p 256 -m 4096", "microbatches or fewer (about"),
    ("simulate zb-v -p 512 -m 4096", "microbatches or fewer (about"),  # 12.6M actions in one schedule
    ("simulate v-min -p 1000000 -m 8", "use fewer ranks"),
    # numbers the planner cannot use, empty values (issue 22)
    ("simulate 1f1b --comm 1e308", "comm must be a finite number from 0 to 1e+09"),
    ("simulate 1f1b --comm nan", "comm must be a finite number from 0 to 1e+09"),
    ("simulate 1f1b --stage-multipliers 1e308", "stage multiplier 0 must be a finite number from 1e-06 to 1e+06"),
    ("simulate 1f1b --stage-multipliers 1,nan", "stage multiplier 1 must be a finite number"),
    ("simulate 1f1b --activation-bytes 1e308 --json", "--activation-bytes '1e308' must be from 0 to 1024TiB"),
    ("simulate 1f1b --costs 1e308,1,1 --json", "cost F must be a finite number from 1e-06 to 1e+09"),
    ("compare --comm 1e308 --json", "comm must be a finite number"),
    ("draw 1f1b --costs inf,1,1 -o {dir}/x.svg", "cost F must be a finite number"),
    ("draw 1f1b -p 2 -m 4 --comm 1e12 -o {dir}/x.svg", "comm must be a finite number from 0 to 1e+09"),
    ("report -p 2 -m 4 --comm 1e12 -o {dir}/r.html", "comm must be a finite number from 0 to 1e+09"),
    ("export 1f1b --costs=", "--costs is empty"),
    ("simulate 1f1b --stage-multipliers=", "--stage-multipliers is empty"),
    ("export 1f1b --memory-limit=", "--memory-limit '' is not a size"),
    ("simulate zb-v --activation-bytes 1MiB --recompute=", "--recompute is empty"),
    ("advise -p 2 -m 4 --layers 4 --hidden 64 --seq-len 64 --microbatch-size 1 --activation-dtype=", "--activation-dtype '' is not known"),
    ("advise -p 2 -m 4 --layers 4 --hidden 64 --seq-len 64 --microbatch-size 1 --attention=", "--attention '' is not known"),
    # schedule CSVs that once escaped as exceptions or took unbounded memory
    ("simulate --csv {longcell}", "row 1: not a CSV row torch reads (field larger than field limit (131072))"),
    ("simulate --csv {index63}", "the stage number has 19 digits"),
    ("simulate --csv {index5000}", "the microbatch number has 5000 digits"),
    ("simulate --csv {farstage}", "the stage number has 13 digits"),
    ("simulate --csv {gapstage}", "stages 0..9999999 have no actions, but stage 10000000 does"),
    ("simulate --csv {farmicrobatch}", "microbatch 99999999 is run, but the schedule holds only 2 actions"),
    ("draw --csv {farstage} -o {dir}/x.svg", "the stage number has 13 digits"),
    # compare
    ("compare -p 0", "--ranks must be at least 1"),
    ("compare -m -1", "--microbatches must be at least 1"),
    ("compare --json --frob", "No such option: --frob"),
    ("compare extra", "unexpected extra argument"),
    ("compare --memory-limit inf", "--memory-limit 'inf' is not a size"),
    ("compare -p 256 -m 4096", "microbatches or fewer"),
    ("compare --recompute-input 0.1", "--recompute-input needs --memory-limit"),
    # draw
    ("draw zb-v", "Missing option '--output' / '-o'"),
    ("draw zb-v -o chart.pdf", "the suffix must be one of .svg, .png, .json"),
    ("draw zb-v -o {dir}", "it is a folder"),
    ("draw zb-v -o {dir}/missing/x.svg", "folder '{dir}/missing' does not exist"),
    ("draw zb-v -o {file}/x.svg", "is not a folder"),
    ("draw zb-v -o /proc/x.svg", "does not accept new files"),
    ("draw zb-v -o /sys/x.svg", "does not accept new files"),
    ("draw -o {dir}/x.svg", "give a schedule name or --csv FILE"),
    ("draw nope -o {dir}/x.svg", "unknown schedule 'nope'"),
    ("draw --csv {latin1} -o {dir}/x.svg", "is not UTF-8 text"),
    ("draw zb-auto -p 256 -m 4096 -o {dir}/x.svg", "microbatches or fewer"),
    ("draw zb-auto -p 256 -m 4096 -o /proc/x.svg", "does not accept new files"),
    ("draw zb-auto --memory-limit 1 --recompute-input 1.5 -o {dir}/x.svg", "--recompute-input must be from 0 to below 1"),
    # report
    ("report -o {dir}", "it is a folder"),
    ("report -o /proc/r.html", "does not accept new files"),
    ("report -o r.svg", "the suffix must be one of .html, .htm"),
    ("report --objective x -o {dir}/r.html", "objective 'x' is not known"),
    ("report -p 256 -m 4096 -o {dir}/r.html", "microbatches or fewer"),
    ("report -p 256 -m 4096 -o /proc/r.html", "does not accept new files"),
    # advise
    ("advise -p four", "'--ranks' / '-p'"),
    ("advise -p 4", "give --microbatches M"),
    ("advise -p 4 -m 8 --objective fastest", "objective must be one of"),
    ("advise -p 4 -m 8 --schedules nope", "unknown schedule 'nope'"),
    ("advise -p 4 -m 8 --layers 4", "missing --hidden, --seq-len"),
    ("advise -p 4 --global-batch 100 --microbatch-size 3", "not divisible by microbatch size 3"),
    ("advise -p 4 -m 8 --max-chunks 0", "--max-chunks must be a whole number from 1 to 16, got 0"),
    ("advise --profile --costs 1,1,1 -m 8", "--profile measures the costs itself"),
    ("advise -p 256 -m 4096", "microbatches or fewer (about"),
    ("advise --profile -p 256 -m 4096", "microbatches or fewer (about"),
    ("advise -p 8 --global-batch 65536 --microbatch-size 1 --max-microbatches 65536", "--max-microbatches"),
    # advise's numbers that size its work or enter its cost model (issue 22)
    ("advise -p 4 -m 8 --workers 9223372036854775808", "--workers must be a whole number from 1 to"),
    ("advise -p 4 -m 8 --workers 0", "--workers must be a whole number from 1 to"),
    ("advise -p 4 -m 8 --max-chunks 9223372036854775808", "--max-chunks must be a whole number from 1 to 16"),
    ("advise -p 4 -m 8 --layers 9223372036854775808 --hidden 64 --seq-len 64 --microbatch-size 1", "--layers must be a whole number from 1 to 100000"),
    ("advise -p 4 -m 8 --layers 8 --hidden 64 --seq-len 64 --microbatch-size 1 --vocab 9223372036854775808", "--vocab must be"),
    ("advise --gpus 9223372036854775808 --layers 8 --hidden 64 --seq-len 64 --microbatch-size 1 --global-batch 8", "--gpus must be"),
    ("advise -p 4 --global-batch 9223372036854775808 --microbatch-size 1", "--global-batch must be"),
    ("advise --gpus 8 --layers 8 --hidden 64 --seq-len 64 --microbatch-size 1 --global-batch 64 --dp-bandwidth nan", "--dp-bandwidth must be a finite number from 1e-06"),
    ("advise --gpus 8 --layers 8 --hidden 64 --seq-len 64 --microbatch-size 1 --global-batch 64 --dp-bandwidth -1", "--dp-bandwidth must be"),
    ("advise --gpus 8 --layers 8 --hidden 64 --seq-len 64 --microbatch-size 1 --global-batch 64 --dp-bandwidth 0", "--dp-bandwidth must be"),
    ("advise --gpus 8 --layers 8 --hidden 64 --seq-len 64 --microbatch-size 1 --global-batch 64 --bandwidth 10 --dp-latency -1", "--dp-latency must be a finite number from 0"),
    ("advise --gpus 8 --layers 8 --hidden 64 --seq-len 64 --microbatch-size 1 --global-batch 64 --bandwidth 10 --dp-latency nan", "--dp-latency must be"),
    ("advise --gpus 8 --layers 8 --hidden 64 --seq-len 64 --microbatch-size 1 --global-batch 64 --bandwidth 10 --dp-latency inf", "--dp-latency must be"),
    ("advise -p 4 -m 8 --overhead nan", "--overhead must be"),
    # fixed dimensions that each divide --gpus but together do not (the reason was empty)
    ("advise --gpus 8 --gpus-per-node 8 --bandwidth 100 --node-bandwidth 10 --layers 8 --hidden 64 --seq-len 64 "
     "--microbatch-size 1 --global-batch 64 --tp 4 --ranks 4", "--ranks 4 x --tp 4 take 16 GPUs, which does not divide --gpus 8"),
    ("advise --gpus 8 --gpus-per-node 8 --bandwidth 100 --node-bandwidth 10 --layers 8 --hidden 64 --seq-len 64 "
     "--microbatch-size 1 --global-batch 64 --ranks 2 --dp 1 --dp-shard 2 --tp 1", "take 4 GPUs, which is not --gpus 8"),
    ("advise -p 4 -m 8 --costs=", "--costs is empty"),
    # demo
    ("demo --steps 0", "--steps must be at least 1"),
    ("demo --out {file} --no-train", "it exists and is not a folder"),
    ("demo --out /proc/demo --no-train", "does not accept new files"),
    ("demo -p 0 --out {dir}/demo --no-train", "--ranks must be at least 1"),
    ("demo --no-train maybe", "unexpected extra argument"),
    ("demo -p 256 -m 4096 --out {dir}/demo --no-train", "microbatches or fewer"),
]

# pipesched train: argument parsing and the options it checks before any rank starts (a few: the
# model's checks cost an import of torch, seconds of CPU; the others are answered before it)
TRAIN_BAD_INPUTS: list[tuple[str, str]] = [
    ("train --ranks two", "'--ranks' / '-p'"),
    ("train --frobnicate", "No such option: --frobnicate"),
    ("train --steps 0", "--steps must be at least 1"),
    ("train --model resnet", "--model 'resnet' is not known"),
    ("train --save-params {dir}", "it is a folder"),
    ("train --save-params /proc/p.pt", "does not accept new files"),
    ("train --trace {dir}/missing/t.json", "does not exist"),
    ("train --csv {latin1}", "is not UTF-8 text"),
    ("train --csv {dir}", "is a folder"),
    ("train --batch-size 10 -m 4", "does not split into 4 equal microbatches"),
    # the local world is bounded: 10,000 processes would each import torch
    ("train --ranks 2 --dp 5000 --batch-size 80000 -m 8", "--ranks 2 x --dp 5000 needs 10000 processes, more than the"),
    ("train -s 1f1b --memory-limit 512KiB", "a size in bytes needs --schedule auto or zb-auto"),
    # --costs steers zb-auto's plan only (refused before torch is imported)
    ("train -s 1f1b --costs 1,1.4,0.6", "--costs with --schedule 1f1b: train builds it without costs"),
    ("train -s auto --costs 1,1,1", "auto measures the costs"),
    ("train --csv {csv} --costs 1,1,1", "is already planned"),
    ("train -s zb-auto --comm 0.1", "--comm 0.1 goes with --costs F,B,W"),
    ("train -s zb-auto --costs 1,2", "expected three numbers F,B,W"),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bad-input")
    (root / "plain.txt").write_text("not a folder\n")
    (root / "ok.csv").write_text("0F0,0B0\n")
    (root / "latin1.csv").write_bytes("0F0,0B0\n# r\xe9sum\xe9\n".encode("latin-1"))
    (root / "empty.csv").write_text("")
    (root / "badcell.csv").write_text("0F0,0X0\n")
    hostile = {  # each once escaped as an exception, or needed unbounded memory or a 90 MB message
        "longcell": "0F0," + "1" * 131_073 + "\n", "index63": f"{2**63}F0\n", "index5000": "0F" + "9" * 5000 + "\n",
        "farstage": "1000000000000F0\n", "gapstage": "10000000F0\n", "farmicrobatch": "0F99999999,0B99999999\n",
    }
    for name, text in hostile.items():
        (root / f"{name}.csv").write_text(text)
    return {
        "dir": str(root), "file": str(root / "plain.txt"), "csv": str(root / "ok.csv"),
        "latin1": str(root / "latin1.csv"), "empty": str(root / "empty.csv"),
        "badcell": str(root / "badcell.csv"), **{name: str(root / f"{name}.csv") for name in hostile},
    }


def run_all(
    table: list[tuple[str, str]], places: dict[str, str], timeout: float = REFUSED_WITHIN_S, workers: int = 0
) -> list[tuple[list[str], str, subprocess.CompletedProcess]]:
    """Run every row concurrently; (argv, expected words, finished process) in table order."""
    cases = [(line.format(**places).split(), mention.format(**places)) for line, mention in table]

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(SCRIPT), *argv], capture_output=True, text=True, timeout=timeout,
            env=cli_env(), cwd=places["dir"],
        )

    done = concurrently(run, [argv for argv, _ in cases], workers=workers or max(4, 2 * (os.cpu_count() or 1)))
    return [(argv, mention, out) for (argv, mention), out in zip(cases, done)]


def problems(argv: list[str], mention: str, out: subprocess.CompletedProcess) -> list[str]:
    """What is wrong with how ``pipesched ARGV`` refused its input (empty: nothing)."""
    found = []
    if out.returncode != 2:
        found.append(f"exit status {out.returncode}, not 2")
    if "Traceback" in out.stderr:
        found.append("a traceback")
    if out.stdout:
        found.append(f"stdout not empty: {out.stdout[:200]!r}")
    lines = out.stderr.rstrip("\n").splitlines()
    usage_block = len(lines) == 3 and lines[0].startswith("Usage: pipesched") and lines[1].startswith("Try '")
    if not (len(lines) == 1 or usage_block) or not lines[-1].startswith("pipesched: error: "):
        found.append("not one 'pipesched: error:' line (after click's usage block)")
    elif mention not in lines[-1]:
        found.append(f"the message does not mention {mention!r}")
    return [f"pipesched {' '.join(argv)}: {p}\n    stderr: {out.stderr[-600:]!r}" for p in found]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity: where the system has one")
def test_advise_workers_count_the_cores_this_process_may_run_on():
    """``--workers`` is bounded by the cores counted once, in ``environment.local_cores`` (the CPU
    affinity, as train's bound on its ranks): allowed one core, ``--workers 2`` is refused."""
    core = min(os.sched_getaffinity(0))
    argv = ["advise", "--ranks", "2", "--workers", "2"]
    out = subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, timeout=REFUSED_WITHIN_S, env=cli_env(),
                         preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    found = problems(argv, "--workers must be a whole number from 1 to 1, got 2", out)
    assert not found, "\n".join(found)


def test_the_table_covers_every_command_and_sixty_inputs():
    commands = {line.split()[0] for line, _ in BAD_INPUTS + TRAIN_BAD_INPUTS}
    assert {"list", "export", "simulate", "compare", "draw", "report", "advise", "train", "demo"} <= commands
    assert len(BAD_INPUTS) + len(TRAIN_BAD_INPUTS) >= 60


def test_the_console_script_is_installed():
    assert SCRIPT.is_file(), f"no console script at {SCRIPT}: pip install -e . first"


def test_bad_input_is_one_short_line_and_exit_2(places):
    failures = [p for argv, mention, out in run_all(BAD_INPUTS, places) for p in problems(argv, mention, out)]
    assert not failures, "\n".join(failures)
    assert not (Path(places["dir"]) / "x.svg").exists() and not (Path(places["dir"]) / "r.html").exists()


@pytest.mark.parametrize("argv", [
    ["draw", "zb-auto", "-p", "8", "-m", "16", "-o", "/proc/x.svg"],
    ["export", "zb-auto", "-o", "/proc/x.csv"],
    ["report", "-o", "/proc/r.html"],
    ["demo", "--out", "/proc/demo", "--no-train"],
])
def test_a_bad_output_path_is_refused_before_any_planning(argv, monkeypatch, capsys):
    from pipesched import planning
    from pipesched.cli import main

    def planned(*args, **kwargs):
        raise AssertionError(f"pipesched {' '.join(argv)} planned before checking its output path")

    # every schedule built passes one of these guards first (build_schedule, simulate_all, advise)
    monkeypatch.setattr(planning, "check_schedule_size", planned)
    monkeypatch.setattr(planning, "check_planning_time", planned)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "does not accept new files" in capsys.readouterr().err


# answered from the options alone: neither torch (seconds of CPU to import) nor the model is needed
TRAIN_REFUSED_WITHOUT_TORCH = [(line, mention) for line, mention in TRAIN_BAD_INPUTS if "--model" not in line]

_REFUSE_ALL = """
import json, sys
from pipesched.cli import main
codes = []
for argv in json.loads(sys.argv[1]):
    try:
        main(argv)
    except SystemExit as exit_:
        codes.append(exit_.code)
print(json.dumps({"codes": codes, "torch imported": "torch" in sys.modules}))
"""


def test_train_refuses_what_needs_no_model_without_importing_torch(places):
    rows = [line.format(**places).split() for line, _ in TRAIN_REFUSED_WITHOUT_TORCH]
    out = subprocess.run([sys.executable, "-c", _REFUSE_ALL, json.dumps(rows)], capture_output=True, text=True,
                         timeout=REFUSED_WITHIN_S, env=cli_env(), cwd=places["dir"])
    assert out.returncode == 0, out.stderr
    said = json.loads(out.stdout)
    assert said == {"codes": [2] * len(rows), "torch imported": False}, out.stderr
    for line, mention in TRAIN_REFUSED_WITHOUT_TORCH:
        assert mention.format(**places) in out.stderr, line


@pytest.mark.skipif(not HAS_TORCH, reason="pipesched train needs PyTorch")
def test_train_refuses_bad_options_before_starting_ranks(places):
    # each of these imports torch (hundreds of MB): a few at a time, with time to spare on a busy machine
    done = run_all(TRAIN_BAD_INPUTS, places, timeout=300, workers=4)
    failures = [p for argv, mention, out in done for p in problems(argv, mention, out)]
    assert not failures, "\n".join(failures)
