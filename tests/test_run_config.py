"""A ``pipesched train`` run as one declared value: ``--print-config`` writes the resolved run as
TOML that ``--config`` reads back to the same run; a run file's mistakes are one line naming the
key and the file, exit 2; flags override the file, and a run read from a file trains bitwise like
the same run given as flags; each option is declared once, on the run's tree."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from conftest import SRC, cli_env, concurrently

from pipesched.declared import flag, in_file
from pipesched.training.config.run_config import SECTIONS
from pipesched.training.config.run_file import tomllib  # tomli below Python 3.11

PIPESCHED = Path(sys.executable).with_name("pipesched")  # the console script users run


def pipesched(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(PIPESCHED), *args], capture_output=True, text=True, timeout=timeout, env=cli_env())


def one_line_error(result) -> str:
    """The refusal's one line (exit 2, nothing else on stderr, nothing on stdout)."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and not result.stdout, result.stderr
    assert lines[0].startswith("pipesched: error: "), lines
    return lines[0]


# every kind of value a run file holds: text (with a quote, a backslash, a non-ASCII letter), whole
# numbers, numbers with a fraction or an exponent, switches, paths, and options left unset
GIVEN = ["--model", "gpt", "--steps", "3", "--lr", "1e-05", "--min-lr", "0.0", "--weight-decay", "0.25",
         "--skip-nonfinite", "--csv", 'dir "a"\\b-é.csv', "--checkpoint-dir", "ck", "--memory-limit", "2.5",
         "-s", "zb-v", "-p", "2", "--dp", "2", "--clip-grad-norm", "1.5", "--timeout", "30"]


def test_print_config_round_trips_through_config(tmp_path):
    printed = pipesched("train", *GIVEN, "--print-config")
    assert printed.returncode == 0, printed.stderr
    run = tomllib.loads(printed.stdout)
    assert run["training"] == {"steps": 3, "batch_size": 64, "seed": 0, "timeout": 30.0, "skip_nonfinite": True,
                               "clip_grad_norm": 1.5, "verbose": False}
    assert run["schedule"]["csv"] == 'dir "a"\\b-é.csv' and run["schedule"]["memory_limit"] == "2.5"
    assert run["optimizer"]["lr"] == 1e-05 and run["layout"] == {"ranks": 2, "dp": 2, "dp_shard": 1, "tp": 1, "ep": 1,
                                                                  "ep_pairs_in_turn": False}
    assert "eval_every" not in run["evaluation"]  # unset: TOML has no null, the default is read back
    path = tmp_path / "run.toml"
    path.write_text(printed.stdout)
    again = pipesched("train", "--config", str(path), "--print-config")
    assert again.returncode == 0 and again.stdout == printed.stdout, again.stderr


def test_flags_override_the_file_and_the_file_overrides_defaults(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[training]\nsteps = 7\nbatch_size = 32\n[optimizer]\nlr = 1\n[schedule]\nschedule = "zb-h1"\n')
    run = tomllib.loads(pipesched("train", "--config", str(path), "--steps", "2", "-s", "1f1b", "--print-config").stdout)
    assert run["training"]["steps"] == 2 and run["schedule"]["schedule"] == "1f1b"  # the flags
    assert run["training"]["batch_size"] == 32 and run["optimizer"]["lr"] == 1.0  # the file (a whole number as a float)
    assert run["training"]["seed"] == 0  # neither: the default


# (file text, what the one line says after "pipesched: error: FILE: ")
BAD_FILES = [
    ("[training]\nstepz = 3\n", "unknown key [training] stepz (did you mean [training] steps?)"),
    ("[training]\nlr = 0.1\n", "unknown key [training] lr (did you mean [optimizer] lr?)"),  # in another table
    ("[trainingg]\nseed = 1\n", "unknown key [trainingg] seed (did you mean [training] seed?)"),
    ("[outputs]\nold_json_path = 'x.json'\n", "unknown key [outputs] old_json_path"),  # a deprecated spelling has none
    ("[training]\nsteps = \"3\"\n", "[training] steps must be a whole number, got str '3'"),
    ("[training]\nsteps = 2.0\n", "[training] steps must be a whole number, got float 2.0"),
    ("[training]\nskip_nonfinite = 1\n", "[training] skip_nonfinite must be true or false, got int 1"),
    ("[optimizer]\nlr = true\n", "[optimizer] lr must be a number, got true or false"),
    ("[checkpoint]\ncheckpoint_dir = 3\n", "[checkpoint] checkpoint_dir must be a path (a string), got int 3"),
    ("[training]\nsteps = 0\n", "[training] steps must be at least 1, got 0"),
    ("[layout]\ndp_shard = -2\n", "[layout] dp_shard must be at least 1, got -2"),
    ("[optimizer]\nlr = nan\n", "[optimizer] lr must be a finite number above 0"),
    ("[training]\nseed = -1\n", "[training] seed must be a whole number from 0 to 4294967295, got -1"),
    ("[evaluation]\neval_share = 1.5\n", "[evaluation] eval_share must be above 0 and below 1"),
    ("steps = 3\n", "steps = ... stands outside any table: write it under one of [model], [training]"),
]


@pytest.fixture(scope="module")
def bad_file_runs(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("bad-files")
    paths = []
    for i, (text, _) in enumerate(BAD_FILES):
        paths.append(folder / f"run{i}.toml")
        paths[-1].write_text(text)
    return dict(zip(range(len(BAD_FILES)), concurrently(lambda p: (p, pipesched("train", "--config", str(p))), paths)))


@pytest.mark.parametrize("row", range(len(BAD_FILES)), ids=[said.split(" must")[0] for _, said in BAD_FILES])
def test_a_mistake_in_a_run_file_is_one_line_naming_the_key_and_the_file(row, bad_file_runs):
    path, result = bad_file_runs[row]
    line = one_line_error(result)
    assert line.startswith(f"pipesched: error: {path}: {BAD_FILES[row][1]}"), line


def test_a_file_that_is_not_toml_or_not_there_is_one_line(tmp_path):
    (tmp_path / "broken.toml").write_text("[training\n")
    assert "not a TOML file" in one_line_error(pipesched("train", "--config", str(tmp_path / "broken.toml")))
    assert "cannot read it" in one_line_error(pipesched("train", "--config", str(tmp_path / "none.toml")))


def test_a_flag_out_of_range_names_the_flag_not_a_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[training]\nsteps = 3\n")
    assert "--steps must be at least 1, got 0" in one_line_error(pipesched("train", "--config", str(path), "--steps", "0"))


def test_each_option_is_declared_once_on_the_run_tree():
    """Every key of a run file is one flag of ``train`` and every flag one field: its default and
    help live on the field, and no module of the train command declares a flag of its own."""
    from typer.main import get_command

    from pipesched.cli import _register_commands, app

    _register_commands()
    command = get_command(app).commands["train"]
    on_command = {p.opts[0]: p.default for p in command.params}
    declared = [(flag(f), f.default) for section in SECTIONS.values() for f in fields(section)]
    assert len({name for name, _ in declared}) == len(declared)  # no flag in two sections
    assert dict(declared) == {k: v for k, v in on_command.items() if k not in ("--config", "--print-config")}
    keys = [f.name for section in SECTIONS.values() for f in fields(section) if in_file(f)]
    assert len(set(keys)) == len(keys)
    job = [*(SRC / "pipesched" / "cli").glob("train*.py"), *(SRC / "pipesched" / "training" / "job").glob("*.py")]
    for module in job:
        calls = [node for node in ast.walk(ast.parse(module.read_text()))
                 if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Option"]
        assert not calls, f"{module.name} declares an option outside the run's tree (training/config/run_config.py)"


def test_a_size_given_to_memory_limit_is_the_named_option_it_now_is_with_a_warning():
    """``--memory-limit`` takes M_B; its old size meanings warn and name the option that has them."""
    sharded = pipesched("train", "--model", "gpt", "-s", "1f1b", "--ranks", "2", "--dp-shard", "2",
                        "--memory-limit", "1KiB", "--rank-memory-limit", "1KiB")
    assert "give --rank-memory-limit alone" in one_line_error(sharded)
    plain = pipesched("train", "-s", "1f1b", "--activation-limit", "1GiB")
    assert "--activation-limit needs --schedule auto or zb-auto" in one_line_error(plain)
    number = pipesched("train", "-s", "zb-auto", "--activation-limit", "4")
    assert "--activation-limit 4: give a size with a unit" in one_line_error(number)
    # the old spelling alone still works: a warning, then the run goes on (here to a later refusal)
    old = pipesched("train", "-s", "zb-auto", "--memory-limit", "1KiB", "--recompute-input", "2")
    warning, error = old.stderr.strip().splitlines()
    assert warning == ("pipesched: warning: train --memory-limit with a size is deprecated and goes in the next "
                       "release: use --activation-limit 1KiB (--memory-limit takes M_B)")
    assert error.startswith("pipesched: error: --recompute-input must be from 0 to below 1") and old.returncode == 2


@pytest.mark.torch
def test_a_run_file_with_steps_overridden_trains_bitwise_like_the_same_flags(tmp_path):
    """The file says 5 steps and ``--steps 2`` overrides it: the weights and losses are those of
    the run given as flags, to the bit (the same seed, data and order: nothing differs)."""
    torch = pytest.importorskip("torch")
    flags = ["--model", "mlp", "-s", "1f1b", "--ranks", "2", "-m", "2", "--batch-size", "8", "--lr", "0.1",
             "--seed", "3", "--optimizer", "adamw", "--warmup", "1", "--lr-schedule", "cosine"]
    run_file = tmp_path / "run.toml"
    run_file.write_text(pipesched("train", *flags, "--steps", "5", "--print-config").stdout)
    outputs = {side: (tmp_path / f"{side}.pt", tmp_path / f"{side}.json") for side in ("flags", "file")}
    argv = {"flags": [*flags, "--steps", "2"], "file": ["--config", str(run_file), "--steps", "2"]}
    done = concurrently(lambda side: pipesched("train", *argv[side], "--save-params", str(outputs[side][0]),
                                               "--summary", str(outputs[side][1]), timeout=300), ["flags", "file"])
    for result in done:
        assert result.returncode == 0, result.stderr
    (a_params, a_summary), (b_params, b_summary) = outputs["flags"], outputs["file"]
    assert json.loads(a_summary.read_text())["losses"] == json.loads(b_summary.read_text())["losses"]
    assert len(json.loads(b_summary.read_text())["losses"]) == 2
    a, b = torch.load(a_params, weights_only=True), torch.load(b_params, weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# a sharded layout (its stages' memory predicted before launch) writing checkpoints and a summary
DRY = ["--model", "gpt", "-s", "zb-v", "--ranks", "2", "--dp-shard", "2", "--batch-size", "16", "--steps", "3"]


@pytest.mark.torch
def test_a_dry_run_prints_the_run_and_its_layout_and_starts_no_rank(tmp_path):
    """``--dry-run`` passes every check before launch, prints what ``--print-config`` prints and
    the layout, exits 0, and leaves nothing: no checkpoint folder made, no summary written (a
    rank started would have trained, written both and printed its losses)."""
    outputs = ["--checkpoint-dir", str(tmp_path / "new" / "ck"), "--summary", str(tmp_path / "run.json")]
    dry, printed = concurrently(lambda last: pipesched("train", *DRY, *outputs, last),
                                ["--dry-run", "--print-config"])
    assert dry.returncode == 0 and not dry.stderr, dry.stderr
    run, said = dry.stdout.split("\n\n# dry run:")
    assert run + "\n" == printed.stdout and tomllib.loads(dry.stdout) == tomllib.loads(printed.stdout)
    assert said.splitlines()[1:] == ["# schedule: zb-v, ranks=2 microbatches=8 chunks=2",
                                     "# layout: pp 2 x dp 1 x dp_shard 2 x tp 1 = 4 processes"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.torch
def test_a_dry_run_refuses_what_train_refuses_in_the_same_line(tmp_path):
    """Refusals made after the model is built, one per late check: the sharded stages' predicted
    memory, the checkpoint folder to resume from; the same line and exit 2, with or without
    ``--dry-run``."""
    (tmp_path / "empty").mkdir()
    late = [[*DRY, "--rank-memory-limit", "1KiB"], [*DRY, "--checkpoint-dir", str(tmp_path / "empty"), "--resume"]]
    runs = concurrently(lambda argv: pipesched("train", *argv), [*late, *[[*argv, "--dry-run"] for argv in late]])
    for plain, dry in zip(runs[:2], runs[2:]):
        assert one_line_error(dry) == one_line_error(plain)
    assert "a rank memory limit of 1 KiB" in one_line_error(runs[0])
    assert "no complete checkpoint" in one_line_error(runs[1])


def test_train_help_says_what_data_reads():
    """``--data`` takes token files and text through the tokenizer (docs/training.md's table)."""
    shown = " ".join(pipesched("train", "--help").stdout.split())
    for word in (".bin", ".npy", ".txt", ".jsonl", ".parquet", "tokenizer.json", "--tokenizer", "bytes"):
        assert word in shown, word


ADVISE = ["advise", "-p", "2", "--microbatch-size", "1", "--global-batch", "8", "--schedules", "1f1b,zb-h1", "--json"]


def test_advise_reads_its_model_description_from_a_file_and_flags_override_it(tmp_path):
    """``advise --config`` with ``--hidden`` overriding the file advises what the same description
    as flags does, to the byte of its JSON (the same numbers go into the same search)."""
    path = tmp_path / "model.toml"
    path.write_text("[model]\nlayers = 8\nhidden = 512\nseq_len = 512\ngpu_memory = 80\n")
    from_file, from_flags = concurrently(lambda argv: pipesched(*ADVISE, *argv), [
        ["--config", str(path), "--hidden", "256"],
        ["--layers", "8", "--hidden", "256", "--seq-len", "512", "--gpu-memory", "80"]])
    assert from_file.returncode == 0 and from_file.stdout == from_flags.stdout, from_file.stderr
    path.write_text("[model]\nlayers = 0\n")
    assert one_line_error(pipesched(*ADVISE, "--config", str(path))).endswith(
        f"{path}: [model] layers must be a whole number from 1 to 100000, got 0")
    path.write_text("[model]\nlayer = 8\n")
    assert one_line_error(pipesched(*ADVISE, "--config", str(path))).endswith(
        f"{path}: unknown key [model] layer (did you mean [model] layers?)")


def test_the_sample_in_the_docs_is_the_example_file_that_runs_and_reads_as_a_run():
    """docs/training.md shows docs/examples/run.toml (part of it): the same values, and the file
    is a run ``--config`` takes."""
    root = SRC.parent
    shown = (root / "docs" / "training.md").read_text().split("```toml\n", 1)[1].split("```", 1)[0]
    example = tomllib.loads((root / "docs" / "examples" / "run.toml").read_text())
    for table, keys in tomllib.loads(shown).items():
        assert keys.items() <= example[table].items(), table
    printed = pipesched("train", "--config", str(root / "docs" / "examples" / "run.toml"), "--print-config")
    assert printed.returncode == 0, printed.stderr
    resolved = tomllib.loads(printed.stdout)
    assert all(keys.items() <= resolved[table].items() for table, keys in example.items())
