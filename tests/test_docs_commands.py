"""Every command line in README.md and docs/*.md runs as written.

A command line is a line of a shell block (```bash, or an unmarked block) that starts with
``pipesched``, ``python``, ``torchrun``, ``bash`` or ``PYTHONPATH=`` (after a ``$ `` prompt, which
is taken off), its continuation lines joined, its ``# comment`` left out. Each is a case named by
its file and line. It runs through bash in a folder that holds what the docs name (the inputs
below, made once for the module), with this checkout's .venv first on PATH (the installed
``pipesched`` console script), and must exit 0; where the doc shows the ``pipesched: error:``
line the command prints after a ``$`` prompt, it must exit 2 with that line.

- ``pipesched train`` runs with ``--dry-run``: every check train makes before launching, no rank
  started; through the console script's entry point in a process forked from one that imported
  torch once (zygote.py: as processes of their own, forty would take minutes). A dry run
  with ``--checkpoint-dir`` writes nothing; the folder then gets the checkpoint a real run
  leaves (one step of the same model, made once), so the lines after it that ``--resume`` or
  ``checkpoint verify`` it run as a reader of the docs would run them.
- The quick commands (list, simulate, compare, draw, report, export, checkpoint) run for real,
  forked from the same process as the dry runs (a line that needs a shell, ``>`` and the like,
  through bash): 0.1-5 s of CPU each, measured on the 2-core machine, where a process of their
  own adds about 0.35 s of start-up to each.
- Checked by their flags (each flag the line gives is one its command's ``--help`` lists) where
  running them costs far more than a few seconds: ``advise`` pricing a model (6-130 s of CPU a
  line, measured there: it plans every family over chunks and microbatches; ``--profile``
  launches ranks; benchmarks/doc_advise_lines.py runs every one of them for real, and the
  advice itself is tested in tests/test_advise*.py and tests/test_cli_advise.py; the line
  priced from unit costs alone, ``--costs``, runs for real here), ``bash
  scripts/*.sh`` (the demo trains for minutes, the suite runs for fifteen, and either reinstalls
  .venv where its extras differ: the script is parsed with ``bash -n`` and the command it ends
  in answers ``--help``), ``python scripts/make_docs_charts.py``
  (rewrites docs/images; ``--check`` renders every chart, which tests/test_render_gallery.py
  runs). Under ``torchrun`` only rank 0's process runs (its dry run, in the environment torchrun
  gives it, checks the layout against torchrun's world): torchrun's own flags are checked against
  ``torchrun --help`` (a multi-node line names a host to meet at).

Each doc's lines run in order in a folder of their own (a line may read what an earlier one
wrote: ``export ... -o zbv.csv`` then ``simulate --csv zbv.csv``), WORKERS docs at a time.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest
from conftest import ROOT, cli_env, concurrently
from zygote import Zygote

VENV_BIN = Path(sys.executable).parent  # the .venv whose console script users run
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("pipesched", "python", "torchrun", "bash", "PYTHONPATH=")
SHELL_BLOCKS = ("bash", "sh", "shell", "console", "")
WORKERS = 3  # docs run at a time (each its commands in a child of the one zygote: zygote.py)
SHELL = set("<>|;&$`*?~'\"")  # a line with one of these needs bash to mean what it says
TORCHRUN_RANK0 = {"RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@dataclass(frozen=True)
class DocLine:
    """A command line of the docs: where it is, what it says, the error line shown after it (if any)."""

    where: str  # "docs/training.md:9"
    command: str  # continuation lines joined, the comment left out
    shown_error: Optional[str] = None


def doc_lines(path: Path) -> list[DocLine]:
    """The command lines of one Markdown file, in order."""
    lines, found, block = path.read_text(encoding="utf-8").splitlines(), [], None
    i = 0
    while i < len(lines):
        text, start = lines[i], i + 1
        i += 1
        if text.startswith("```"):
            block = text[3:].strip() if block is None else None
            continue
        if block not in SHELL_BLOCKS:
            continue
        prompted = text.startswith("$ ")
        command = text[2:] if prompted else text
        if not command.startswith(PROGRAMS) or command.split()[0].rstrip(":") != command.split()[0]:
            continue  # not a command, or a line of output ("pipesched: error: ...")
        while command.rstrip().endswith("\\"):  # continuation lines
            command = command.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
        shown = lines[i] if prompted and i < len(lines) and lines[i].startswith("pipesched: error:") else None
        command = re.sub(r"\s+#\s.*$", "", command).strip()
        found.append(DocLine(f"{path.relative_to(ROOT)}:{start}", command, shown))
    return found


LINES = {doc: doc_lines(doc) for doc in DOCS}
CASES = [line for found in LINES.values() for line in found]


# --- the inputs the docs name ---------------------------------------------------------------


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    """The one process every ``pipesched`` line here is forked from (zygote.py)."""
    pytest.importorskip("transformers")
    started = Zygote(cli_env())
    yield started
    started.close()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, zygote) -> Path:
    return make_inputs(tmp_path_factory.mktemp("doc-inputs"), zygote)


def make_inputs(folder: Path, zygote: Zygote) -> Path:
    """``folder`` holding what the docs' lines read: the checkout's docs/ and scripts/, a tiny
    Llama's config.json, the folders llama/ (config and BPE tokenizer) and DIR/ (config,
    tokenizer and weights), the shipped text as corpus.txt and its lines (40 times) as
    docs.jsonl and corpus.jsonl, a torch CSV my_schedule.csv; and ckpt-of-gpt/, the folder one step of
    ``train --model gpt`` leaves."""
    from hf_cases import make_config
    from tokenizer_cases import VOCAB, model_folder, shipped_documents, write_jsonl
    from transformers import AutoConfig, AutoModelForCausalLM

    import pipesched
    from pipesched.data.streams import shipped_text_path

    for name in ("docs", "scripts"):
        (folder / name).symlink_to(ROOT / name)
    model_folder(folder / "llama")  # positions for docs/training.md's --seq-len 256:
    make_config("llama", vocab_size=VOCAB, max_position_embeddings=256).to_json_file(str(folder / "llama/config.json"))
    model_folder(folder / "DIR")
    shutil.copy(folder / "DIR" / "config.json", folder / "config.json")  # DIR's weights fit it (--hf-weights DIR)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder / "DIR")).save_pretrained(folder / "DIR")
    shutil.copy(shipped_text_path(), folder / "corpus.txt")
    for name in ("docs.jsonl", "corpus.jsonl"):  # 40 copies: 1% held out still holds a window of 256 tokens
        write_jsonl(folder / name, shipped_documents() * 40)
    (folder / "my_schedule.csv").write_text(pipesched.build_schedule("1f1b", ranks=4, microbatches=8).to_csv())
    made = zygote.run(["pipesched", "train", "--model", "gpt", "-s", "none", "--steps", "1", "--checkpoint-dir",
                       str(folder / "ckpt-of-gpt")], str(folder), shell_env(folder.parent / "cache"), timeout=600)
    assert made.returncode == 0, made.stderr
    return folder


def shell_env(cache: Path, **extra: str) -> dict:
    env = cli_env()
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env['PATH']}"
    env["PIPESCHED_CACHE_DIR"] = str(cache)  # tokenized text: the module's, not the user's cache
    return {**env, **extra}


def run(command: str, cwd: Path, timeout: float = 600, **extra: str) -> subprocess.CompletedProcess:
    """``command`` through bash in ``cwd``, as typed at a shell."""
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=shell_env(cwd.parent / "cache", **extra))


# --- how each line runs ---------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def help_of(helped: tuple[str, ...], cwd: Path) -> subprocess.CompletedProcess:
    """``helped --help`` in ``cwd`` (asked once a folder: the advise lines of a doc share it)."""
    return run(shlex.join([*helped, "--help"]), cwd)


def flags_listed(argv: list[str], helped: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``helped --help``, made to fail (exit 1, the flags named) unless it lists each flag of ``argv``."""
    shown = help_of(tuple(helped), cwd)
    flags = {word.split("=", 1)[0] for word in argv if word.startswith("--")}
    missing = sorted(f for f in flags if f not in shown.stdout)
    if missing and shown.returncode == 0:
        return subprocess.CompletedProcess(argv, 1, shown.stdout, f"{shlex.join(helped)} --help does not list "
                                           f"{', '.join(missing)}")
    return shown


def torchrun_world(argv: list[str]) -> int:
    """The processes torchrun's ``argv`` starts: --nnodes x --nproc-per-node."""
    sizes = {"--nnodes": 1, "--nproc-per-node": 1}
    for flag, value in zip(argv, argv[1:]):
        if flag in sizes:
            sizes[flag] = int(value)
    return sizes["--nnodes"] * sizes["--nproc-per-node"]


def run_line(line: DocLine, cwd: Path, checkpoint: Path, zygote: Zygote) -> subprocess.CompletedProcess:
    """Run ``line`` as the module's docstring says (``zygote``: the dry runs' process)."""
    argv = shlex.split(line.command)
    if argv[0] == "torchrun":
        program = argv.index("-m") + 1  # torchrun ... -m pipesched train ...
        torchrun = flags_listed(argv[:program - 1], ["torchrun"], cwd)
        if torchrun.returncode != 0:
            return torchrun
        rank0 = shell_env(cwd.parent / "cache", WORLD_SIZE=str(torchrun_world(argv)), **TORCHRUN_RANK0)
        return zygote.run(["pipesched", *argv[program + 1:], "--dry-run"], str(cwd), rank0)
    if argv[0] == "bash":
        parsed = run(f"bash -n {shlex.quote(argv[1])}", cwd)
        ends_in = {"scripts/demo.sh": "pipesched demo --help", "scripts/test.sh": "python -m pytest --help"}[argv[1]]
        return parsed if parsed.returncode != 0 else run(ends_in, cwd)
    if argv[0] == "python":
        return flags_listed(argv, argv[:2], cwd)
    if argv[:2] == ["pipesched", "advise"] and ("--costs" not in argv or SHELL & set(line.command)):
        return flags_listed(argv, argv[:2], cwd)  # a model priced: benchmarks/doc_advise_lines.py runs it
    if argv[:2] == ["pipesched", "train"]:
        assert not SHELL & set(line.command), line.command  # needs no shell: its argv is the line
        result = zygote.run([*argv, "--dry-run"], str(cwd), shell_env(cwd.parent / "cache"))
        _leave_the_checkpoint_a_run_would(argv, cwd, checkpoint, result)
        return result
    if argv[0] == "pipesched" and not SHELL & set(line.command):
        return zygote.run(argv, str(cwd), shell_env(cwd.parent / "cache"))
    return run(line.command, cwd)


def _leave_the_checkpoint_a_run_would(argv: list[str], cwd: Path, checkpoint: Path, result) -> None:
    """After a dry run that would have started writing checkpoints (``--checkpoint-dir`` without
    ``--resume``), put in the folder what the real run leaves: a checkpoint of the same model."""
    if result.returncode != 0 or "--checkpoint-dir" not in argv or "--resume" in argv:
        return
    folder = cwd / argv[argv.index("--checkpoint-dir") + 1]
    if not folder.exists():
        shutil.copytree(checkpoint, folder)


@pytest.fixture(scope="module")
def results(inputs, zygote) -> dict[str, subprocess.CompletedProcess]:
    """Every line's result: each doc's lines in order, in a folder of its own, three docs at a time
    (each its commands in children of one zygote: one import of torch for all)."""

    def run_doc(doc: Path) -> list[tuple[str, subprocess.CompletedProcess]]:
        cwd = inputs.parent / f"run-{doc.stem}"
        cwd.mkdir()
        for item in inputs.iterdir():
            if item.name != "ckpt-of-gpt":
                (cwd / item.name).symlink_to(item)
        return [(line.where, run_line(line, cwd, inputs / "ckpt-of-gpt", zygote)) for line in LINES[doc]]

    docs = sorted((doc for doc in DOCS if LINES[doc]), key=lambda doc: -len(LINES[doc]))  # the longest first
    return dict(pair for done in concurrently(run_doc, docs, workers=WORKERS) for pair in done)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(600)  # the first case waits for every line: 141 s of CPU measured, about 70 s on 2 quiet cores
@pytest.mark.parametrize("line", CASES, ids=[line.where for line in CASES])
def test_the_command_line_runs_as_written(line: DocLine, results):
    result = results[line.where]
    if line.shown_error is None:
        assert result.returncode == 0, f"{line.command}\n{result.stderr[-2000:]}"
    else:
        assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == line.shown_error, result.stderr


def test_the_lines_are_found_whole():
    """The extraction itself: a continued line is one command, a comment is not part of it, and
    a shown error goes with its `$` line."""
    readme = {line.where: line for line in LINES[ROOT / "README.md"]}
    training = [line for line in CASES if "--report run.html" in line.command and line.where.startswith("README")]
    assert len(training) == 1 and training[0].command.endswith("--report run.html")
    assert all("#" not in line.command for line in CASES)
    shown = [line for line in readme.values() if line.shown_error]
    assert shown and shown[0].command == "pipesched simulate zb-auto -p 256 -m 4096"
    assert len(CASES) > 80

