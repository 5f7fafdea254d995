"""Many ``pipesched`` commands that import torch, each for the cost of its own work.

A ``pipesched train --dry-run`` spends nearly all of its seconds importing torch, transformers and
torch's compiler (the stages' shapes are inferred on the meta device). The docs hold some forty
``train`` lines: as separate processes they alone would take minutes of the suite's two cores.
:class:`Zygote` is one process that imports all of that once and forks a child per command;
the child is the command: it takes the command's folder, environment and argv, writes its
stdout and stderr to files, and calls the installed ``pipesched`` console script's entry point
(looked up as the console script itself looks it up). Its exit code is the command's.

Run as a script it is the server: one JSON request a line on stdin (argv, cwd, env), one JSON
answer a line on stdout (returncode, stdout, stderr).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
from importlib.metadata import entry_points

WARM = ("torch", "torch.distributed", "torch._dynamo", "sympy", "transformers",
        "transformers.models.llama.modeling_llama", "pipesched.cli.train", "pipesched.hf.cli_model",
        "pipesched.runtime.engine.shapes", "pipesched.training.models", "pipesched.training.train")


class Zygote:
    """A server process (this file as a script) that runs commands on request, one at a time."""

    def __init__(self, env: dict):
        self.process = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)

    def run(self, argv: list[str], cwd: str, env: dict) -> subprocess.CompletedProcess:
        self.process.stdin.write(json.dumps({"argv": argv, "cwd": cwd, "env": env}) + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        return subprocess.CompletedProcess(argv, answer["returncode"], answer["stdout"], answer["stderr"])

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


def _serve() -> None:
    entry = next(e for e in entry_points(group="console_scripts") if e.name == "pipesched")
    command = entry.load()
    for name in WARM:
        importlib.import_module(name)
    for request in sys.stdin:
        asked = json.loads(request)
        with tempfile.TemporaryDirectory() as folder:
            out, err = os.path.join(folder, "out"), os.path.join(folder, "err")
            pid = os.fork()
            if pid == 0:
                _become(command, asked, out, err)
            _, status = os.waitpid(pid, 0)
            answer = {"returncode": os.waitstatus_to_exitcode(status)}
            for key, path in (("stdout", out), ("stderr", err)):
                with open(path, encoding="utf-8", errors="replace") as handle:
                    answer[key] = handle.read()
        print(json.dumps(answer), flush=True)


def _become(command, asked: dict, out: str, err: str) -> None:
    """In the forked child: be the command ``asked`` for, as its console script would be; never returns."""
    code = 1
    try:
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
