"""``advise`` prices expert parallelism (issue 40 item 4), through the installed console script:
the experts described, ``--ep`` fixed, each row carrying ``ep``; refusals in one line, exit 2.
The costs themselves (all-to-alls on their link, experts split by EP, DualPipe's hidden half)
are checked in tests/test_layout_costs.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env, concurrently

PIPESCHED = Path(sys.executable).with_name("pipesched")  # the console script users run
MODEL = ("--layers", "8", "--hidden", "1024", "--seq-len", "512", "--heads", "16", "--vocab", "32000",
         "--microbatch-size", "2", "--global-batch", "64", "--gpu-memory", "40", "--flops", "100")
MOE = ("--experts", "8", "--experts-per-token", "2", "--expert-hidden", "512", "--shared-experts", "1",
       "--dense-layers", "1")
WHOLE = ("--gpus", "16", "--gpus-per-node", "4", "--bandwidth", "100", "--node-bandwidth", "10")
REFUSED = {
    "dense": ("--ep 2 needs a model with experts", WHOLE + ("--ep", "2", "-p", "4")),
    "experts": ("does not divide the 8 experts", WHOLE + MOE + ("--ep", "3", "-p", "4", "--tp", "1", "--dp", "1")),
    "ranks": ("--ep 8 does not divide its 4 data-parallel ranks", WHOLE + MOE + ("--ep", "8", "-p", "4", "--tp", "1")),
    "half described": ("--experts-per-token describe experts: give --experts too",
                       WHOLE + ("--experts-per-token", "2", "-p", "4")),
    "without nodes": ("--ep with --gpus needs --gpus-per-node", ("--gpus", "16", "--bandwidth", "100") + MOE + ("--ep", "2")),
    "pipeline only": ("ignores --ep", MOE + ("--ep", "2", "--ranks", "4", "--bandwidth", "100")),
}


def _advise(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(PIPESCHED), "advise", *MODEL, *args], capture_output=True, text=True, timeout=120,
                          env=cli_env())


@pytest.fixture(scope="module")
def launched():
    """Every launch of this module at once: the searched layouts' JSON and each refusal."""
    fixed = WHOLE + MOE + ("--ep", "4", "-p", "4", "--tp", "1", "--schedules", "1f1b,dualpipev")
    open_ep = WHOLE + MOE + ("-p", "4", "--tp", "1", "--schedules", "1f1b,dualpipev", "--json")
    runs = {"rows": fixed + ("--json",), "text": fixed, "open": open_ep,
            **{name: args for name, (_, args) in REFUSED.items()}}
    return dict(zip(runs, concurrently(lambda args: _advise(*args), list(runs.values()))))


def test_every_row_carries_ep_and_dualpipev_hides_its_all_to_alls(launched):
    result = launched["rows"]
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert rows and all(r["ep"] == 4 for r in rows)
    assert {r["schedule"] for r in rows} == {"1f1b", "dualpipev"}
    pair = next(r for r in rows if r["schedule"] == "dualpipev")
    assert 0 <= pair["costs"]["overlap"] < 1  # the pair's all-to-alls behind the other half
    assert all(r["costs"]["overlap"] == pair["costs"]["overlap"] for r in rows)  # one cost model per layout


def test_without_ep_the_search_tries_every_size_dividing_the_experts_and_the_data_parallel_ranks(launched):
    # issue 40 item 4: EP borrows ranks of dp_shard x dp (torchtitan); 8 experts, 4 such ranks: 1, 2, 4
    result = launched["open"]
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)  # stdout is the JSON alone: no progress line in it
    assert {r["ep"] for r in rows} == {1, 2, 4}
    for ep in (1, 2, 4):  # each EP size a layout of its own, with its best row of both families
        assert {r["schedule"] for r in rows if r["ep"] == ep and r["dp_shard"] == 4} == {"1f1b", "dualpipev"}


def test_the_pick_says_what_ep_costs(launched):
    result = launched["text"]
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # rich folds lines at the terminal's width
    assert "Recommendation: pp 4 x dp 1 x dp_shard 4 x tp 1 with dualpipev" in text
    assert "ep 4: a dispatch and a combine all-to-all per layer" in text and "routed experts split 4 ways" in text


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_ep_and_the_experts_are_refused_in_one_line(launched, name):
    result = launched[name]
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and not result.stdout, result.stderr
    assert REFUSED[name][0] in lines[0]
