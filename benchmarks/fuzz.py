"""The fuzz counts of benchmarks/RESULTS.md: many more generated cases than tests/test_cli_fuzz.py.

Generates ``--options`` command lines with an extreme value of one numeric option (simulate,
export, draw, compare, advise and advise --gpus) and ``--csvs`` schedule CSVs with
tests/fuzz_cases.py's strategies (deterministic: a fixed seed), runs them in batches through
pipesched's entry point and counts: refused in one line (exit 2), accepted (exit 0, strict JSON
where asked), and anything else (a traceback, another exit status, a long message, a run past
its bound), listing the first few of those.

    PYTHONPATH=src python benchmarks/fuzz.py --options 1000 --csvs 1000
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from fuzz_cases import csv_case, csv_cases, option_case, problems, run_batch  # noqa: E402

BATCH = 100


def generate(strategy, count: int, at: int) -> list:
    """``count`` examples of ``strategy``, the same every run for the same ``at``."""
    found: list = []

    @seed(at)
    @settings(max_examples=count, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example):
        found.append(example)

    collect()
    return found[:count]


def tally(kind: str, cases: list[list[str]], folder: Path) -> list[str]:
    codes: Counter = Counter()
    wrong: list[str] = []
    slowest = 0.0
    for start in range(0, len(cases), BATCH):
        for outcome in run_batch(cases[start:start + BATCH], folder):
            found = problems(outcome)
            wrong += found
            codes["other" if found else {0: "accepted", 2: "refused"}.get(outcome.code, "other")] += 1
            slowest = max(slowest, outcome.seconds)
    print(f"{kind}: {len(cases)} cases: {codes['refused']} refused in one line (exit 2), "
          f"{codes['accepted']} accepted (exit 0), {codes['other']} otherwise; slowest {slowest:.2f} s")
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--options", type=int, default=1000, help="option cases to generate")
    parser.add_argument("--csvs", type=int, default=1000, help="CSV cases to generate")
    args = parser.parse_args()
    random.seed(0)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        wrong = tally("options", generate(option_case(), args.options, 22), folder)
        wrong += tally("CSVs", csv_cases(generate(csv_case(), args.csvs, 23), folder), folder)
    for line in wrong[:10]:
        print(line)
    print(f"{time.monotonic() - started:.0f} s in all")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
