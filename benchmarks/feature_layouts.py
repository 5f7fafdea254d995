"""Every run feature at once on each of the five layouts (pp, dp, dp_shard, tp, HSDP), checked
feature by feature against the one-process run: tests/test_feature_layouts.py's checks
(tests/feature_layout_cases.py) on every layout, where the suite runs one.

    python benchmarks/feature_layouts.py [LAYOUT ...]

Prints one line per layout and feature, ``ok`` or the failed check; exits 1 if any failed.
Each layout is two launches (the run, then its resume); two layouts run at a time.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from conftest import concurrently, run_cli  # noqa: E402
from feature_layout_cases import CHECKS, LAYOUTS, launch, reference, write_inputs  # noqa: E402


def main() -> int:
    layouts = sys.argv[1:] or list(LAYOUTS)
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        raise SystemExit(f"unknown layout {unknown[0]!r}: one of {', '.join(LAYOUTS)}")
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config, tokens = write_inputs(folder)
        jobs = [("reference", lambda: reference(run_cli, folder, config, tokens))]
        jobs += [(name, lambda name=name: launch(run_cli, folder, name, config, tokens)) for name in layouts]
        runs = dict(zip((name for name, _ in jobs), concurrently(lambda job: job[1](), jobs, workers=2)))
        failed = 0
        for name in layouts:
            for feature, check in CHECKS.items():
                try:
                    check(runs[name], runs["reference"])
                    print(f"{name:9s} {feature:18s} ok")
                except AssertionError as err:
                    failed += 1
                    print(f"{name:9s} {feature:18s} FAILED {str(err).splitlines()[0] if str(err) else ''}")
    print(f"{len(layouts)} layouts x {len(CHECKS)} features, {failed} failed, {time.monotonic() - start:.0f} s wall")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
