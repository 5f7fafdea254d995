"""Put on PYTHONPATH by the kill tests: in every rank of ``pipesched train``, the checkpoint
of step $PIPESCHED_TEST_PAUSE_STEP, once complete and visible, is followed by the rank writing
its pid to $PIPESCHED_TEST_PAUSE_DIR/rank<R>.pid and, for the ranks in
$PIPESCHED_TEST_PAUSE_RANKS (default: all), sleeping: the test then kills a rank or the launcher
at a known point of the run, with no race against the remaining steps. The patch is made in every
process (a forked rank inherits the launcher's, a spawned one makes its own); only a rank, a
member of a process group, pauses."""

import os

if os.environ.get("PIPESCHED_TEST_PAUSE_STEP"):
    import time

    import torch.distributed as dist

    from pipesched.runtime.checkpoints import checkpoint

    original_save = checkpoint.save

    def save_then_pause(directory, step, *args, **kwargs):
        path = original_save(directory, step, *args, **kwargs)
        if dist.is_initialized() and step == int(os.environ["PIPESCHED_TEST_PAUSE_STEP"]):
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
