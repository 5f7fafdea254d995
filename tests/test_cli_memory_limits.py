"""Issue 38: ``--memory-limit`` means one thing in every command, peak activations per rank in
M_B; a limit in bytes has its own flag, ``--activation-limit`` (activations, where their size is
known) or ``--rank-memory-limit`` (all a rank holds). A size given to ``--memory-limit`` is the
old spelling of the flag its case now has: it warns once and runs as that flag does."""

from __future__ import annotations

import json

import pytest
import typer

from conftest import concurrently, run_cli
from pipesched.cli import app
from pipesched.cli import memory_limits as ml
from pipesched.cli.advise_flags import SEARCH_OPTIONS, SearchFlags
from pipesched.errors import ConfigError

SIMULATE = ("simulate", "zb-auto", "-p", "4", "-m", "8", "--activation-bytes", "1GiB", "--json")
# a rank's 4 layers' weights, gradients and optimizer state take 48.2 MiB (tests/test_memory.py)
ADVISE = ("advise", "--ranks", "2", "--layers", "8", "--hidden", "256", "--seq-len", "64", "--microbatch-size",
          "1", "--microbatches", "4", "--schedules", "1f1b,gpipe,zb-v", "--json")


def warning(command: str, new: str, size: str) -> str:
    return (f"pipesched: warning: {command} --memory-limit with a size is deprecated and goes in the next release: "
            f"use {new} {size} (--memory-limit takes M_B)")


def test_every_command_takes_the_one_declaration_of_each_limit():
    declared = {d.param_decls[0]: d.help for d in (ml.MemoryLimit, ml.ActivationLimit, ml.RankMemoryLimit)}
    import pipesched.cli.advise, pipesched.cli.draw, pipesched.cli.plan, pipesched.cli.train  # noqa: F401, E401  (register)

    seen = set()
    for name, command in typer.main.get_command(app).commands.items():
        for param in command.params:
            flag = next((o for o in param.opts if o in declared), None)
            if flag is not None:
                assert param.help == declared[flag], (name, flag)
                seen.add((name, flag))
    assert {("simulate", "--activation-limit"), ("advise", "--activation-limit"), ("advise", "--rank-memory-limit"),
            ("train", "--activation-limit"), ("train", "--rank-memory-limit")} <= seen
    assert {c for c, f in seen if f == "--memory-limit"} >= {"simulate", "compare", "export", "draw", "report",
                                                            "advise", "train"}


def test_each_old_spelling_warns_once_and_runs_as_the_new_flag():
    rows = [(*SIMULATE, "--activation-limit", "2GiB"), (*SIMULATE, "--memory-limit", "2GiB"),
            (*ADVISE, "--rank-memory-limit", "51.2MiB"), (*ADVISE, "--memory-limit", "51.2MiB")]
    sim_new, sim_old, advise_new, advise_old = concurrently(lambda row: run_cli(*row), rows)
    for new, old in ((sim_new, sim_old), (advise_new, advise_old)):
        assert new.returncode == 0 and old.returncode == 0, old.stderr
        assert json.loads(old.stdout) == json.loads(new.stdout) and new.stderr == ""
    assert json.loads(sim_new.stdout)["peak_memory"] == [2.0] * 4  # 2GiB over 1GiB per M_B
    assert sim_old.stderr.strip() == warning("simulate", "--activation-limit", "2GiB")
    assert advise_old.stderr.strip() == warning("advise", "--rank-memory-limit", "51.2MiB")


def flags(**given: str) -> SearchFlags:
    values = {name: given.get(name) for name, _, _ in SEARCH_OPTIONS}
    return SearchFlags(**values)


def test_with_a_profile_a_size_is_the_activation_limit(capsys):
    new = flags(activation_limit="512KiB").limits(profiled=True, described=False)
    assert capsys.readouterr().err == ""
    assert flags(memory_limit="512KiB").limits(profiled=True, described=False) == new == (None, 512 * 2**10)
    assert capsys.readouterr().err.strip() == warning("advise", "--activation-limit", "512KiB")
    assert flags(memory_limit="2").limits(profiled=True, described=False) == (2.0, None)


@pytest.mark.parametrize("given,profiled,described,fragment", [
    ({"activation_limit": "1GiB"}, False, True, "--activation-limit needs --profile"),
    ({"rank_memory_limit": "1GiB"}, True, False, "--rank-memory-limit needs a model description"),
    ({"rank_memory_limit": "1GiB"}, False, False, "--rank-memory-limit needs a model description"),
    ({"memory_limit": "40GiB"}, False, False, "--memory-limit takes M_B units"),
    ({"memory_limit": "4", "rank_memory_limit": "1GiB"}, False, True, "are each a memory limit: give one"),
    ({"memory_limit": "1GiB", "rank_memory_limit": "1GiB"}, False, True, "give --rank-memory-limit alone"),
    ({"rank_memory_limit": "4"}, False, True, "give a size with a unit"),
])
def test_advise_refuses_a_limit_its_costs_cannot_hold(given, profiled, described, fragment):
    with pytest.raises(ConfigError, match=fragment):
        flags(**given).limits(profiled=profiled, described=described)


@pytest.mark.parametrize("args,fragment", [
    (["compare", "-p", "4", "--memory-limit", "40GiB"], "--memory-limit takes M_B units"),
    (["export", "zb-v", "--memory-limit", "1MiB", "-o", "x.csv"], "a size in bytes is --activation-limit"),
    (["simulate", "zb-auto", "--activation-limit", "1GiB"], "--activation-limit needs the activation size"),
    ([*SIMULATE, "--activation-limit", "2"], "give a size with a unit"),
    ([*SIMULATE, "--memory-limit", "2", "--activation-limit", "2GiB"], "both limit the activations: give one"),
])
def test_a_size_where_no_size_is_known_is_one_line_and_exit_2(args, fragment):
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesched: error:") and fragment in lines[0], lines
