"""Local runs side by side whose ranks stop right after joining: how many fail to join.

A rank with nothing to say to a peer finishes, and closes its connections, as soon as it has
joined. Unless every group is left only once all its ranks have joined it
(``TORCH_DIST_INIT_BARRIER=1``, which ``launch.init_group`` sets unless the environment says
otherwise), a peer still connecting may see its connection closed, and gloo fails its join with
"Connection closed by peer". The race needs a loaded machine: runs go side by side, in rounds
that alternate the barrier off (``TORCH_DIST_INIT_BARRIER=0``) and on:

    python benchmarks/join_race.py --runs 96 --parallel 4
    python benchmarks/join_race.py --runs 96 --parallel 4 --only-on --check   # exit 1 on a failure
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROUND = 8  # runs of one setting before the other's turn


def nothing_after_joining(rank: int, world: int, _payload) -> int:
    """A worker that stops as soon as its rank has joined."""
    return rank


def one_run(world: int) -> str:
    """"ok", or the first line of why the run failed."""
    from pipesched.runtime.launching.launch import spawn

    try:
        spawn(nothing_after_joining, world, None, timeout_s=60)
        return "ok"
    except Exception as err:  # noqa: BLE001  (counted, not raised: the point is how often)
        return str(err).splitlines()[0][:120]


def rounds(runs: int, settings: list[str]) -> list[str]:
    """The setting of each run: ``ROUND`` runs of each in turn, so both see the same load."""
    order = []
    while len(order) < runs * len(settings):
        for setting in settings:
            order += [setting] * ROUND
    return order[: runs * len(settings)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=48, help="runs of each setting")
    parser.add_argument("--parallel", type=int, default=4, help="runs at once")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--only-on", action="store_true", help="run with the barrier only")
    parser.add_argument("--check", action="store_true", help="exit 1 if a run with the barrier failed")
    args = parser.parse_args()
    settings = ["on"] if args.only_on else ["off", "on"]
    outcomes: dict[str, collections.Counter] = {s: collections.Counter() for s in settings}
    order = rounds(args.runs, settings)
    start = time.monotonic()
    with ThreadPoolExecutor(args.parallel) as pool:
        for i in range(0, len(order), ROUND):
            setting = order[i]
            if setting == "off":
                os.environ["TORCH_DIST_INIT_BARRIER"] = "0"
            else:
                os.environ.pop("TORCH_DIST_INIT_BARRIER", None)
            for outcome in pool.map(lambda _: one_run(args.ranks), range(ROUND)):
                outcomes[setting][outcome] += 1
    print(f"{len(order)} runs of {args.ranks} ranks, {args.parallel} at once, {time.monotonic() - start:.0f} s")
    for setting in settings:
        counts = outcomes[setting]
        failed = sum(n for outcome, n in counts.items() if outcome != "ok")
        print(f"barrier {setting}: {failed} of {sum(counts.values())} failed")
        for outcome, n in counts.most_common():
            if outcome != "ok":
                print(f"  {n} x {outcome}")
    if args.check and sum(n for o, n in outcomes["on"].items() if o != "ok"):
        sys.exit(1)


if __name__ == "__main__":
    main()
