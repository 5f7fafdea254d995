"""Many ``pipesched`` commands, each for the cost of its own work.

A ``pipesched`` command that trains (or dry-runs) spends 5-7 s of CPU importing torch,
transformers and torch's compiler before it does anything (the stages' shapes are inferred on the
meta device); a one-process ``train -s none`` of a tiny model, its whole run. A quick command
(``simulate``, ``export``, ``draw``) spends most of its own starting Python and importing pipesched.
:class:`Zygote` is one process that imports all of that once and forks a child per command; the
child is the command: it takes the command's folder, environment and argv, writes its stdout and
stderr to files, and calls the installed ``pipesched`` console script's entry point (looked up as
the console script itself looks it up). Its exit code is the command's; it leads a process group
of its own (as a shell's job does), which holds the ranks it starts. Several commands may run at
once (one per thread asking), each in its own child; one that outlives its timeout is killed,
group and all, and its caller gets ``subprocess.TimeoutExpired``.

For the tests of what a command computes (the docs' lines, tests/conftest.py's ``forked_cli``);
the tests of how a process starts, stops or is signalled run the console script itself.

Run as a script it is the server: one JSON request a line on stdin (id, argv, cwd, env, timeout),
one JSON answer a line on stdout (id, returncode, stdout, stderr, timed_out) as each command ends.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from importlib.metadata import entry_points
from typing import Optional

WARM = ("torch", "torch.distributed", "torch._dynamo", "sympy", "transformers",
        "transformers.models.llama.modeling_llama", "pipesched.cli.train", "pipesched.hf.cli_model",
        "pipesched.runtime.engine.shapes", "pipesched.training.models", "pipesched.training.train")
POLL_S = 0.02  # how often the server looks for ended (or overdue) commands while it waits for requests


class Zygote:
    """A server process (this file as a script) that runs the commands threads ask for, at once."""

    def __init__(self, env: dict):
        self.process = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._waiting: dict[int, queue.Queue] = {}
        self._reader = threading.Thread(target=self._read_answers, daemon=True)
        self._reader.start()

    def run(self, argv: list[str], cwd: str, env: dict, timeout: Optional[float] = None) -> subprocess.CompletedProcess:
        """``argv`` (``["pipesched", ...]``) run in ``cwd`` with ``env``, as ``subprocess.run`` with
        ``capture_output=True, text=True`` runs the console script."""
        answer: queue.Queue = queue.Queue(maxsize=1)
        with self._lock:
            key = next(self._ids)
            self._waiting[key] = answer
            asked = {"id": key, "argv": argv, "cwd": cwd, "env": env, "timeout": timeout}
            self.process.stdin.write(json.dumps(asked) + "\n")
            self.process.stdin.flush()
        got = answer.get()
        if got.get("timed_out"):
            raise subprocess.TimeoutExpired(argv, timeout, got["stdout"], got["stderr"])
        return subprocess.CompletedProcess(argv, got["returncode"], got["stdout"], got["stderr"])

    def _read_answers(self) -> None:
        """Hand each answer to the thread that asked; if the server ends, a failure to every one left."""
        for line in self.process.stdout:
            got = json.loads(line)
            with self._lock:
                self._waiting.pop(got["id"]).put(got)
        with self._lock:
            for waiting in self._waiting.values():
                waiting.put({"returncode": -1, "stdout": "", "stderr": "the zygote server ended"})
            self._waiting.clear()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)
        self._reader.join(timeout=60)


class _Running:
    """The server's commands under way: child pid -> (request id, output folder, deadline)."""

    def __init__(self):
        self.children: dict[int, tuple[int, str, float]] = {}

    def start(self, command, asked: dict) -> None:
        folder = tempfile.mkdtemp()
        pid = os.fork()
        if pid == 0:
            _become(command, asked, os.path.join(folder, "out"), os.path.join(folder, "err"))
        self.children[pid] = (asked["id"], folder, time.monotonic() + (asked.get("timeout") or float("inf")))

    def reap(self, block: bool) -> None:
        """Answer for every ended child (waiting for one if ``block``); kill the overdue ones' groups."""
        now = time.monotonic()
        for pid, (_, _, deadline) in self.children.items():
            if now > deadline:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        while self.children:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            if pid == 0:
                return
            key, folder, deadline = self.children.pop(pid)
            answer = {"id": key, "returncode": os.waitstatus_to_exitcode(status), "timed_out": now > deadline}
            for name, file in (("stdout", "out"), ("stderr", "err")):
                with open(os.path.join(folder, file), encoding="utf-8", errors="replace") as handle:
                    answer[name] = handle.read()
            shutil.rmtree(folder, ignore_errors=True)
            print(json.dumps(answer), flush=True)
            block = False


def _serve() -> None:
    entry = next(e for e in entry_points(group="console_scripts") if e.name == "pipesched")
    command = entry.load()
    for name in WARM:
        try:
            importlib.import_module(name)
        except ImportError:  # an extra not installed (transformers): the commands that need it say so themselves
            pass
    running, pending, open_input = _Running(), b"", True
    while open_input or running.children:
        if open_input and select.select([0], [], [], POLL_S)[0]:
            chunk = os.read(0, 1 << 16)
            open_input = bool(chunk)
            *requests, pending = (pending + chunk).split(b"\n")
            for request in requests:
                running.start(command, json.loads(request))
        running.reap(block=not open_input and all(d == float("inf") for _, _, d in running.children.values()))
        if not open_input and running.children:
            time.sleep(POLL_S)


def _become(command, asked: dict, out: str, err: str) -> None:
    """In the forked child: be the command ``asked`` for, as its console script would be; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)  # a group of its own, with the ranks it starts: what a timeout kills
        os.chdir(asked["cwd"])
        os.environ.clear()
        os.environ.update(asked["env"])
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # not the server's requests
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv = list(asked["argv"])
        code = command()
    except SystemExit as done:
        code = done.code
    except BaseException:  # a traceback, as the interpreter prints it, exit 1
        traceback.print_exc()
        code = 1
    finally:
        if isinstance(code, str):  # sys.exit("message"): printed, exit 1, as the interpreter does
            print(code, file=sys.stderr)
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)


if __name__ == "__main__":
    _serve()
