"""Put on PYTHONPATH by the kill tests: in every spawned rank of ``pipesched train``, the checkpoint
of step $PIPESCHED_TEST_PAUSE_STEP, once complete and visible, is followed by the rank writing
its pid to $PIPESCHED_TEST_PAUSE_DIR/rank<R>.pid and, for the ranks in
$PIPESCHED_TEST_PAUSE_RANKS (default: all), sleeping: the test then kills a rank or the launcher
at a known point of the run, with no race against the remaining steps.

A rank runs no interpreter start-up of its own where it is forked from multiprocessing's fork
server (``pipesched.runtime.rank_start``): the server runs this file, and its ranks inherit the
patch."""

import os
import sys


def _starts_ranks() -> bool:
    """This process is a spawned rank, or the fork server that ranks are forked from."""
    server = any("multiprocessing.forkserver import main" in arg for arg in getattr(sys, "orig_argv", []))
    return server or "--multiprocessing-fork" in sys.argv


if os.environ.get("PIPESCHED_TEST_PAUSE_STEP") and _starts_ranks():
    import time

    import torch.distributed as dist

    from pipesched.runtime import checkpoint

    original_save = checkpoint.save

    def save_then_pause(directory, step, *args, **kwargs):
        path = original_save(directory, step, *args, **kwargs)
        if step == int(os.environ["PIPESCHED_TEST_PAUSE_STEP"]):
            rank = dist.get_rank()
            pid_file = os.path.join(os.environ["PIPESCHED_TEST_PAUSE_DIR"], f"rank{rank}.pid")
            with open(pid_file + ".tmp", "w") as fh:
                fh.write(str(os.getpid()))
            os.replace(pid_file + ".tmp", pid_file)
            paused = os.environ.get("PIPESCHED_TEST_PAUSE_RANKS")
            if paused is None or str(rank) in paused.split(","):
                time.sleep(3600)
        return path

    checkpoint.save = save_then_pause
