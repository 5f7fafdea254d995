"""Every ``pipesched advise`` line of README.md and docs/*.md, run for real, as a reader types it.

tests/test_docs_commands.py runs every other doc line in the suite, but checks the advise lines
that price a model by their flags only: each plans every family over chunks and microbatches
(6-130 s of CPU a line on the 2-core machine), about nine minutes of CPU for all of them, more
than the suite can spend. The one line priced from unit costs alone (``--costs``) runs for real
there; this benchmark runs all of them, each through bash in a folder holding what the docs
name (the test module's own inputs), and prints its exit status and CPU seconds (user + sys of
it and its ranks: ``resource.getrusage`` of the children). Exits 1 if any line fails.

    PYTHONPATH=src:tests python benchmarks/doc_advise_lines.py [SUBSTRING ...]

A SUBSTRING keeps the lines whose place (``docs/layouts.md:11``) or text contains it.
"""

from __future__ import annotations

import resource
import sys
import tempfile
from pathlib import Path

from conftest import cli_env
from test_docs_commands import CASES, make_inputs, run
from zygote import Zygote


def advise_lines(keep: list[str]) -> list:
    """The docs' advise lines (those with a shown error are refusals the suite runs already)."""
    lines = [line for line in CASES if line.command.startswith("pipesched advise") and line.shown_error is None]
    return [line for line in lines if not keep or any(k in line.where or k in line.command for k in keep)]


def children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def main(keep: list[str]) -> int:
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        zygote, folder = Zygote(cli_env()), Path(tmp) / "doc-inputs"
        folder.mkdir()
        try:
            inputs = make_inputs(folder, zygote)
        finally:
            zygote.close()
        for line in advise_lines(keep):
            before = children_cpu()
            result = run(line.command, inputs)
            cpu = children_cpu() - before
            failed += result.returncode != 0
            print(f"{line.where:28} exit {result.returncode}  {cpu:6.1f} s CPU  {line.command[:90]}", flush=True)
            if result.returncode != 0:
                print(result.stderr[-1500:], flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
