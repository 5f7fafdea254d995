"""A run that loses nothing, through the installed ``pipesched`` console script: killed after
step 3 of 6 (one rank by SIGKILL, or the launcher by SIGKILL or SIGHUP), it resumes from its
checkpoint to the same final weights as the uninterrupted run, bitwise on CPU (within 1e-6 under
another schedule); no process of the run outlives its launcher; bad options exit 2 before any
rank starts.

The kills are deterministic: ``pause_at_checkpoint/sitecustomize.py`` makes the ranks sleep once
the checkpoint of step 3 is complete and say their pids, and the test kills only then.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import SRC, as_from_a_terminal, concurrently

torch = pytest.importorskip("torch")

from pipesched.runtime.launching.launch import FAILURE_GRACE_S  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds a run's processes in /proc"),
]

PIPESCHED = Path(sys.executable).with_name("pipesched")
PAUSE_HOOK = Path(__file__).resolve().parent / "pause_at_checkpoint"
TIMEOUT_S = 10
RUN = ["--model", "mlp", "--ranks", "2", "--steps", "6", "--batch-size", "16", "-m", "4",
       "--optimizer", "adamw", "--lr", "0.001", "--timeout", str(TIMEOUT_S)]


def _env(pause_dir: Path | None = None, ranks: str | None = None) -> dict:
    env = dict(os.environ, COLUMNS="160")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PAUSE_HOOK) if pause_dir else "", str(SRC)]))
    if pause_dir is not None:
        env.update(PIPESCHED_TEST_PAUSE_STEP="3", PIPESCHED_TEST_PAUSE_DIR=str(pause_dir))
        if ranks is not None:
            env["PIPESCHED_TEST_PAUSE_RANKS"] = ranks
    return env


def _train(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    result = subprocess.run([str(PIPESCHED), "train", *args], capture_output=True, text=True,
                            env=_env(), timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result


def _params(path: Path) -> dict:
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The final weights of the 6-step run of each schedule the kill tests resume. Both runs start
    at once, in the background, when the first test asks: they take the cores the paused runs
    leave idle (a launcher waiting out its grace, ranks asleep) instead of a launch each of their
    own; each is awaited where it is compared."""
    folder = tmp_path_factory.mktemp("whole")
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = {schedule: pool.submit(_train, *RUN, "--schedule", schedule, "--save-params", str(folder / f"{schedule}.pt"))
                for schedule in ("1f1b", "zb-v")}

        def final(schedule: str) -> dict:
            runs[schedule].result()
            return _params(folder / f"{schedule}.pt")

        yield final


class PausedRun:
    """A run started in its own session that has checkpointed step 3 and paused there."""

    def __init__(self, tmp_path: Path, schedule: str, *extra: str, columns: str = "160") -> None:
        self.pids_dir = tmp_path / "pids"
        self.pids_dir.mkdir()
        self.checkpoints = tmp_path / "checkpoints"
        self.proc = subprocess.Popen(
            as_from_a_terminal([str(PIPESCHED), "train", *RUN, "--schedule", schedule, "--checkpoint-dir",
                                str(self.checkpoints), "--checkpoint-every", "1", *extra]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**_env(self.pids_dir), "COLUMNS": columns},
            start_new_session=True,
        )
        self.ranks = self._wait_for_pause(deadline=time.monotonic() + 240)

    def _wait_for_pause(self, deadline: float) -> list[int]:
        files = [self.pids_dir / f"rank{r}.pid" for r in range(2)]
        while not all(f.exists() for f in files):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                out, err = self.proc.communicate()
                pytest.fail(f"the run never paused after step 3: {err[-2000:]}")
            time.sleep(0.05)
        return [int(f.read_text()) for f in files]

    def finish(self, timeout: float = 180) -> subprocess.CompletedProcess:
        out, err = self.proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)

    def processes_left(self) -> list[int]:
        """Every live process of the run's session (the launcher, its ranks, their helpers)."""
        return [pid for pid, session, state in _processes() if session == self.proc.pid and state != "Z"]


def _processes():
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            yield int(entry.name), int(fields[3]), fields[0]


def _no_process_left(run: PausedRun, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while run.processes_left():
        assert time.monotonic() < deadline, f"left running: {run.processes_left()}"
        time.sleep(0.1)


def _resume(run: PausedRun, schedule: str, out: Path, checkpoints: Path | None = None) -> dict:
    _train(*RUN, "--schedule", schedule, "--checkpoint-dir", str(checkpoints or run.checkpoints), "--resume",
           "--save-params", str(out))
    return _params(out)


def _bitwise_equal(got: dict, want: dict) -> bool:
    return got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_rank_killed_after_step_3_resumes_to_the_uninterrupted_weights(tmp_path, uninterrupted):
    run = PausedRun(tmp_path, "1f1b")
    os.kill(run.ranks[1], signal.SIGKILL)
    failed = run.finish()
    assert failed.returncode == 1
    assert failed.stderr.strip().splitlines()[-1].startswith("pipesched: error: rank 1 died (killed by signal 9)")
    _no_process_left(run, within_s=5)
    assert [p.name for p in sorted(run.checkpoints.iterdir())] == ["step-000002", "step-000003"]
    assert _bitwise_equal(_resume(run, "1f1b", tmp_path / "resumed.pt"), uninterrupted("1f1b"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_launcher_killed_by_sigkill_leaves_no_rank_and_resumes_exactly(tmp_path, uninterrupted):
    run = PausedRun(tmp_path, "zb-v")
    os.kill(run.proc.pid, signal.SIGKILL)
    run.finish()
    _no_process_left(run, within_s=TIMEOUT_S + 5)
    step3 = tmp_path / "step3"
    shutil.copytree(run.checkpoints, step3)
    # resumed under zb-v, and the same checkpoint (its copy) under another schedule at once: 2
    # stages instead of zb-v's 4, the layout re-derived from the unpipelined names
    resumed, other = concurrently(lambda args: _resume(run, *args), [
        ("zb-v", tmp_path / "resumed.pt"), ("1f1b", tmp_path / "as-1f1b.pt", step3)], workers=2)
    assert _bitwise_equal(resumed, uninterrupted("zb-v"))
    want = uninterrupted("zb-v")
    assert max(float((other[k] - want[k]).abs().max()) for k in want) < 1e-6


@pytest.fixture(scope="module")
def runs_to_stop(tmp_path_factory):
    """Two 1f1b runs paused after step 3, started side by side: one to hang up on, one to interrupt
    (by what the launcher will say). A run no test stopped is killed, its whole session, at the end."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        starting = {said: pool.submit(PausedRun, tmp_path_factory.mktemp(said), "1f1b") for said in ("SIGHUP", "Ctrl-C")}
    paused = [run.result() for run in starting.values() if run.exception() is None]
    try:
        yield {said: run.result() for said, run in starting.items()}  # fails here if one never paused
    finally:
        for run in paused:
            if run.proc.poll() is None:
                os.killpg(run.proc.pid, signal.SIGKILL)
                run.finish()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("signum,to_group,said", [
    (signal.SIGHUP, False, "SIGHUP"),  # a closed terminal, a dropped ssh session
    (signal.SIGINT, True, "Ctrl-C"),  # Ctrl-C: the terminal signals its whole foreground group
])
def test_a_launcher_hung_up_on_or_interrupted_says_so_in_one_line_and_stops_every_rank(runs_to_stop, signum, to_group, said):
    run = runs_to_stop[said]
    if to_group:
        os.killpg(run.proc.pid, signum)
    else:
        os.kill(run.proc.pid, signum)
    stopped = run.finish()
    assert stopped.returncode == 128 + signum
    assert stopped.stderr.strip().splitlines()[-1] == (
        f"pipesched: stopped by {said}: the run and every rank were stopped ({run.checkpoints} holds what to --resume from)"
    )
    assert "Traceback" not in stopped.stderr
    _no_process_left(run, within_s=TIMEOUT_S + 5)


# The sigstopped run's timeout. Before the launcher looked at a silent rank's process state, it
# gave the stopped rank the grace live ranks get to report (min(timeout, FAILURE_GRACE_S)) after
# the live rank timed out, so the command ran at least timeout + grace from the stop. The test
# bounds it by exactly that, which leaves min(timeout, FAILURE_GRACE_S) seconds for what no
# launcher can skip and load stretches: the live rank finishing its checkpoint and reaching the
# receive it times out on, its report, stopping both processes. At 5 s (a 5-s allowance) a loaded
# CI machine measured 9.4 s; 10 s gives the largest allowance the grace allows.
SIGSTOPPED_TIMEOUT_S = 10
# the runs whose ranks fall silent after step 3's checkpoint: (options, those global ranks, what is
# done to them, where they stall: "checkpoint" right after it, "step" at their first send of step 4)
SILENT = {
    "with a peer": ([*RUN, "--ranks", "2", "--timeout", "3"], (1,), None, "checkpoint"),  # its live peer times out on it
    "alone": ([*RUN, "--ranks", "1", "--timeout", "3"], (0,), None, "checkpoint"),  # no peer: the launcher watches it
    "sigstopped": ([*RUN, "--timeout", str(SIGSTOPPED_TIMEOUT_S)], (1,), signal.SIGSTOP, "checkpoint"),  # it cannot even say why
}
# 8 processes, global rank = 4 dp_shard + 2 pp + tp: pipeline rank 0 (global 0, 1, 4, 5) stalls
# inside a step, and its peers time out on its activation. Run by itself: its 8 ranks' start-up
# beside SILENT's runs starved their 3-second timeouts (a step of "alone" took longer). Its own
# timeout is generous: 8 ranks on 2 cores beside the suite's other worker wait seconds on each
# other's turns at every agreement (at 5 s the step-start agreement itself timed out in a suite
# run, before any rank stalled); what it checks is the naming, not how soon the command ends
# (SILENT's runs bound that)
SHARDED_TIMEOUT_S = 20
SHARDED_PEER = ([*RUN, "--model", "gpt", "--tp", "2", "--dp-shard", "2", "--timeout", str(SHARDED_TIMEOUT_S)],
                (0, 1, 4, 5), None, "step")


def _fall_silent(tmp_path: Path, args: list[str], silent: tuple[int, ...], signum: int | None,
                 where: str) -> tuple[subprocess.CompletedProcess, float]:
    """``pipesched train ARGS`` whose ranks ``silent`` fall silent after step 3's checkpoint, at
    ``where`` (sent ``signum`` then, if given): the finished command and the seconds it ran on
    from the moment the first of them fell silent."""
    pids = tmp_path / "pids"
    pids.mkdir()
    run = [*args, "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "3"]
    env = {**_env(pids, ranks=",".join(map(str, silent))), "PIPESCHED_TEST_PAUSE_IN": where}
    proc = subprocess.Popen(
        [str(PIPESCHED), "train", *run], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env, start_new_session=True,
    )
    pid_files = [pids / f"rank{rank}.pid" for rank in silent]
    while not any(f.exists() for f in pid_files):
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.05)
    if signum is not None:
        os.kill(int(pid_files[0].read_text()), signum)
    silent_since = time.monotonic()
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - silent_since


@pytest.fixture(scope="module")
def silent_runs(tmp_path_factory) -> dict:
    """Every run of SILENT, side by side: each is timed from its own rank's silence, and one's
    waiting out a timeout overlaps the others' start-up."""
    return dict(zip(SILENT, concurrently(
        lambda label: _fall_silent(tmp_path_factory.mktemp("silent"), *SILENT[label]), SILENT, workers=len(SILENT))))


@pytest.fixture(scope="module")
def sharded_silent(tmp_path_factory) -> tuple[subprocess.CompletedProcess, float]:
    return _fall_silent(tmp_path_factory.mktemp("sharded"), *SHARDED_PEER)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("label,said", [
    ("with a peer", "rank 1 was stopped"),
    ("alone", "rank 0 timed out after 3s without progress"),
])
def test_a_silent_rank_ends_the_command_within_the_timeout_and_a_few_seconds(silent_runs, label, said):
    finished, silent_for = silent_runs[label]
    err = finished.stderr
    assert finished.returncode == 1 and said in err, err
    assert err.strip().splitlines()[-1].startswith("pipesched: error: ") and "Traceback" not in err
    assert silent_for < 3 + FAILURE_GRACE_S + 5


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_under_tp_and_dp_shard_a_waiting_rank_names_itself_and_its_silent_peer_by_global_rank(sharded_silent):
    """Under ``--tp 2 --dp-shard 2`` pipeline rank 0 is global ranks 0, 1 (its tp pair) and 4, 5
    (the other shard's), pipeline rank 1 is 2, 3, 6, 7 (parallel_layout.RUNTIME_ORDER: dp_shard
    outermost, tp innermost). When pipeline rank 0 stalls inside step 4, each rank of pipeline
    rank 1 waits on the activation its own counterpart sends (global rank minus 2) and says so in
    the launcher's numbering, as the launcher names the ranks it stopped: one line, no traceback."""
    finished, _ = sharded_silent
    lines = finished.stderr.strip().splitlines()
    assert finished.returncode == 1 and "Traceback" not in finished.stderr, finished.stderr
    assert lines[-1].startswith("pipesched: error: ") and not any(l.startswith("pipesched: error: ") for l in lines[:-1])
    waits = re.findall(rf"rank (\d+) timed out after {SHARDED_TIMEOUT_S}s waiting at (\S+) for the activation of stage 0 microbatch 0 "
                       r"from rank (\d+)", lines[-1])
    assert waits and all((int(waiter), int(peer)) in {(2, 0), (3, 1), (6, 4), (7, 5)} for waiter, _, peer in waits), lines[-1]
    assert {action for _, action, _ in waits} == {"1F0"}  # the first forward of stage 1, inside the step
    stopped = {int(r) for r in re.findall(r"rank (\d+) was stopped", lines[-1])}
    assert stopped and stopped <= {0, 1, 4, 5}, lines[-1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_sigstopped_rank_ends_the_command_right_after_the_timeout(silent_runs):
    """A stopped process cannot say why it stopped: the launcher does not wait out the grace
    it gives live ranks to report (here 10 s), it names the rank as stopped at once."""
    timeout = SIGSTOPPED_TIMEOUT_S
    finished, elapsed = silent_runs["sigstopped"]
    err = finished.stderr
    assert finished.returncode == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"pipesched: error: rank 0: rank 0 timed out after {timeout}s waiting for the activation of stage 1 "
        "microbatch 0 from rank 1; rank 1 was stopped after the failure (it was not running: stopped by a signal)"
    ) or "(it was not running: stopped by a signal)" in err, err
    assert timeout <= elapsed < timeout + min(timeout, FAILURE_GRACE_S)  # below what waiting out the grace takes


def _train_refusing(args) -> subprocess.CompletedProcess:
    return subprocess.run([str(PIPESCHED), "train", *args], capture_output=True, text=True, env=_env(), timeout=120)


def _said(result: subprocess.CompletedProcess) -> str:
    """The one line of a refusal: exit 2 and one line on stderr, before any rank starts."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("pipesched: error: "), result.stderr
    assert "Traceback" not in result.stderr and not result.stdout
    return lines[0]


BAD_OPTIONS = [
    (["--lr", "-1"], "--lr must be a finite number above 0"),
    (["--lr", "nan"], "--lr must be a finite number above 0"),
    (["--lr", "1e39"], "float32's largest"),
    (["--lr", "0"], "--lr must be a finite number above 0"),
    (["--timeout", "inf"], "--timeout must be a number of seconds above 0"),
    (["--timeout", "0"], "--timeout must be a number of seconds above 0"),
    (["--seed", str(2**70)], "--seed must be a whole number from 0 to 4294967295"),
    (["--seed", "-1"], "--seed must be a whole number from 0 to 4294967295"),
    (["--batch-size", str(10**15)], "more than this machine's"),
    (["--clip-grad-norm", "inf"], "--clip-grad-norm must be a finite number above 0"),
    (["--checkpoint-every", "2"], "--checkpoint-every needs --checkpoint-dir"),
    (["--resume"], "--resume needs --checkpoint-dir"),
]


# the checkpoint options, checked before any rank starts: {empty} is a folder not made yet, {file} a
# plain file, {done} the checkpoint of FINISHED (another model, another optimizer, nothing left to do)
CHECKPOINT_OPTIONS = {
    ("--checkpoint-dir", "{empty}", "--checkpoint-every", "0"): "--checkpoint-every must be at least 1",
    ("--checkpoint-dir", "{empty}", "--checkpoint-keep", "0"): "--checkpoint-keep must be at least 1",
    ("--checkpoint-dir", "{empty}", "--resume"): "no complete checkpoint in",
    ("--checkpoint-dir", "{file}"): "is a file, not a folder",
    ("--checkpoint-dir", "{done}"): "already holds checkpoints (newest step-000001): add --resume",
    ("--model", "gpt", "--checkpoint-dir", "{done}", "--resume"): "is a checkpoint of another model: it has no '0.tokens.weight'",
    ("--optimizer", "adamw", "--checkpoint-dir", "{done}", "--resume"): "was saved with another optimizer",
    ("--steps", "1", "--checkpoint-dir", "{done}", "--resume"): "--steps 1 asks for no more",
}
FINISHED = ("--schedule", "none", "--model", "mlp", "--steps", "1", "--batch-size", "4", "--checkpoint-dir", "{done}")


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict:
    """``pipesched train`` with each row of BAD_OPTIONS and CHECKPOINT_OPTIONS, each its own process
    (each pays Python's start, many torch's too), four at a time: the rows that need no {done}
    while FINISHED makes it, then the rest."""
    root = tmp_path_factory.mktemp("options")
    (root / "file").write_text("")
    places = {name: str(root / name) for name in ("empty", "file", "done")}

    def run(row: tuple) -> subprocess.CompletedProcess:
        args = [arg.format(**places) for arg in row]
        return _train(*args) if row == FINISHED else _train_refusing(args)

    rows = [tuple(args) for args, _ in BAD_OPTIONS] + list(CHECKPOINT_OPTIONS)
    on_done = [row for row in rows if "{done}" in row]
    first = [FINISHED, *(row for row in rows if row not in on_done)]
    return dict(zip(first + on_done, concurrently(run, first) + concurrently(run, on_done)))


@pytest.mark.parametrize("args,fragment", BAD_OPTIONS)
def test_a_bad_option_exits_2_in_one_line_before_spawning(args, fragment, refusals):
    assert fragment in _said(refusals[tuple(args)])


def test_checkpoint_options_are_checked_before_spawning(refusals):
    for args, fragment in CHECKPOINT_OPTIONS.items():
        assert fragment in _said(refusals[args]), args


# ---- the outputs of a run interrupted and resumed (issue 39): one launch stopped by Ctrl-C after
# step 3, one resuming it from step 2, both writing --metrics, --report and --summary; piped, at
# COLUMNS=40, so that a wrapped line would show


@pytest.fixture(scope="module")
def outputs_across_a_resume(tmp_path_factory) -> dict:
    """The stopped launch and the resumed one (each a CompletedProcess) and what each left: the
    stopped run's metrics lines, summary and report, then the resumed run's. Step 3's checkpoint is
    removed between them, as when a run stops after a step's metrics line and before its
    checkpoint: the resumed run starts from step 2, and the interrupted run's line of step 3 is
    one it must set aside."""
    root = tmp_path_factory.mktemp("outputs")
    files = {"metrics": root / "metrics.jsonl", "report": root / "report.html", "summary": root / "summary.json"}
    outputs = [arg for name, path in files.items() for arg in (f"--{name}", str(path))]
    run = PausedRun(root, "1f1b", *outputs, columns="40")
    os.killpg(run.proc.pid, signal.SIGINT)
    stopped = run.finish()
    left = {name: path.read_text() for name, path in files.items()}
    shutil.rmtree(run.checkpoints / "step-000003")
    written = (run.checkpoints / "step-000002" / "manifest.json").stat().st_mtime
    resumed = subprocess.run([str(PIPESCHED), "train", *RUN, "--schedule", "1f1b", "--checkpoint-dir",
                              str(run.checkpoints), "--resume", *outputs], capture_output=True, text=True,
                             env={**_env(), "COLUMNS": "40"}, timeout=240)
    return {"stopped": stopped, "stopped_left": left, "resumed": resumed, "written": written,
            "files": files, "side": files["metrics"].with_name("metrics.jsonl.after-step-2")}


def _lines(text: str) -> list[dict]:
    import json

    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_stopped_run_writes_its_summary_and_report_up_to_its_last_step(outputs_across_a_resume):
    import json

    stopped, left = outputs_across_a_resume["stopped"], outputs_across_a_resume["stopped_left"]
    files = outputs_across_a_resume["files"]
    assert stopped.returncode == 130 and "Traceback" not in stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1].startswith("pipesched: stopped by Ctrl-C: the run and every rank")
    rows = _lines(left["metrics"])
    assert [r["step"] for r in rows] == [1, 2, 3]  # the ranks paused after step 3's checkpoint
    out = stopped.stdout.splitlines()
    assert f"wrote {files['summary']} (run summary), up to step 3" in out
    assert f"wrote {files['report']} (run report), up to step 3" in out
    summary = json.loads(left["summary"])
    assert summary["stopped_after_step"] == 3 and (summary["dp_shard"], summary["tp"]) == (1, 1)
    assert summary["intervals"] == [{"step": r["step"], "loss": r["loss"], "lr": r["lr"]} for r in rows]
    assert "<td>3</td>" in left["report"].split("</table>")[0]  # the table's "steps" cell


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_resumed_run_says_so_first_and_its_metrics_continue_from_its_checkpoint(outputs_across_a_resume):
    from datetime import datetime

    resumed, files = outputs_across_a_resume["resumed"], outputs_across_a_resume["files"]
    assert resumed.returncode == 0, resumed.stderr
    written = datetime.fromtimestamp(outputs_across_a_resume["written"]).astimezone()
    assert resumed.stdout.splitlines()[0] == f"resuming from step 2 (written at {written.isoformat(sep=' ', timespec='seconds')})"
    before = _lines(outputs_across_a_resume["stopped_left"]["metrics"])
    rows = _lines(files["metrics"].read_text())
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # each step once
    assert rows[:2] == before[:2]  # the interrupted run's lines up to the checkpoint, as they were
    assert _lines(outputs_across_a_resume["side"].read_text()) == before[2:]  # its line of step 3, kept aside
    assert f"kept in {outputs_across_a_resume['side']}" in resumed.stdout
    elapsed = [r["elapsed_s"] for r in rows]
    assert elapsed == sorted(elapsed) and elapsed[2] > elapsed[1]  # continued from step 2's, not from 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_terminal_summary_and_report_show_the_same_figures_of_the_whole_run(outputs_across_a_resume):
    """The median step and the bubble, as the metrics file (steps 1 to 6, two launches) defines
    them, on the terminal, in --summary, in the report's table, its text and the drawn step."""
    import json
    import re
    import statistics

    resumed, files = outputs_across_a_resume["resumed"], outputs_across_a_resume["files"]
    rows = _lines(files["metrics"].read_text())
    median_ms = 1000 * statistics.median(r["step_time_s"] for r in rows[1:])  # after the warm-up interval
    interval = sorted(rows[1:], key=lambda r: r["bubble_share"])[(len(rows) - 2) // 2]  # the lower median
    measured, simulated = (f"{100 * interval[k]:.1f}%" for k in ("bubble_share", "simulated_bubble_share"))
    summary, report, out = json.loads(files["summary"].read_text()), files["report"].read_text(), resumed.stdout
    assert summary["median_step_ms"] == median_ms
    assert summary["bubble"] == {"step": interval["step"], "measured": interval["bubble_share"],
                                 "simulated": interval["simulated_bubble_share"]}
    assert (summary["ranks"], summary["dp"], summary["dp_shard"], summary["tp"]) == (2, 1, 1, 1)
    assert "1f1b: ranks=2 microbatches=4 stages=2 chunks=1 placement=loop, layout 2 pp × 1 dp × 1 dp_shard × 1 tp " \
           "(2 processes), fp32" in out
    losses = summary["losses"]  # this launch's steps, 3 to 6: the summary line's two figures are steps'
    assert f"loss of step 3 {losses[0]:.6f} -> of step 6 {losses[-1]:.6f} (resumed after step 2)   " \
           f"median step {median_ms:.2f} ms" in out  # one line, though longer than COLUMNS=40
    said = f"bubble of the median logging interval (step {interval['step']}): measured {measured}"
    assert f"{said}, simulated from its measured costs {simulated}" in out
    table = report.split("</table>")[0]
    assert "<td>6</td>" in table and f"<td>{median_ms:.2f} ms</td>" in table  # the whole run
    assert f"<td>{measured}, {simulated}</td>" in table
    assert f"Bubble of the median logging interval (step {interval['step']}): measured {measured}, " \
           f"simulated from its measured costs {simulated}." in report
    drawn = int(re.search(r"Drawn: step (\d+), measured bubble ([0-9.]+%)", report).group(1))
    titles = re.findall(r"bubble ([0-9.]+%)", report.split("One step, measured and simulated")[1])
    assert titles[0] == re.search(r"Drawn: step \d+, measured bubble ([0-9.]+%)", report).group(1)  # chart = text
    assert titles[-1] == simulated  # the simulated chart: the simulator's run of the interval's costs
    if interval["step"] > 2:  # run by this launch: the step drawn is the median interval's (--log-every 1)
        assert drawn == interval["step"] and titles[0] == measured

def test_a_waiting_rank_names_itself_and_its_peer_by_global_rank():
    """Under --tp or --dp-shard a pipeline rank is several processes: the launcher names them by
    global rank, so a waiting rank does too (it said "rank 0 ... from rank 1" beside the
    launcher's "rank 5 was stopped"). Pipeline ranks 0 and 1 are global 4 and 5 here."""
    from datetime import timedelta

    from pipesched.runtime.comm.p2p import PeerFailure, Transport, describe
    from pipesched.runtime.program.instructions import ACT, Message

    msg = Message(ACT, 1, 0, 1, 0, 0)
    assert describe(msg, {0: 4, 1: 5}.get).endswith("from rank 5")
    transport = Transport.__new__(Transport)  # only what a wait reads: no process group needed
    transport.rank, transport.global_rank, transport.timeout = 0, {0: 4, 1: 5}.get, timedelta(seconds=3)

    class Silent:
        def wait(self, timeout):
            return False

    with pytest.raises(PeerFailure, match=r"^rank 4 timed out after 3s waiting at 1F0 for the activation of stage 1 "
                                          r"microbatch 0 from rank 5$"):
        transport._wait(Silent(), f"at 1F0 for {describe(msg, transport.global_rank)}")
