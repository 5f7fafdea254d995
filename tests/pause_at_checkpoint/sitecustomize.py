"""Put on PYTHONPATH by the kill tests: in every rank of ``pipesched train``, the checkpoint
of step $PIPESCHED_TEST_PAUSE_STEP, once complete and visible, is followed by the rank writing
its pid to $PIPESCHED_TEST_PAUSE_DIR/rank<R>.pid and, for the ranks in
$PIPESCHED_TEST_PAUSE_RANKS (default: all; R is the global rank), sleeping: the test then kills
a rank or the launcher at a known point of the run, with no race against the remaining steps.

With ``PIPESCHED_TEST_PAUSE_IN=step`` a paused rank sleeps inside the next step instead, at its
first point-to-point send (and writes its pid only then): its peers have passed the step's start
(the barrier every rank meets) and wait on that message, so what they report is the wait of a
receive, naming the silent peer, not the step-start collective's. The patch is made in every
process (a forked rank inherits the launcher's, a spawned one makes its own); only a rank, a
member of a process group, pauses."""

import os

if os.environ.get("PIPESCHED_TEST_PAUSE_STEP"):
    import time

    import torch.distributed as dist

    from pipesched.runtime.checkpoints import checkpoint
    from pipesched.runtime.comm.p2p import Transport

    original_save = checkpoint.save
    original_send = Transport.send
    in_step = os.environ.get("PIPESCHED_TEST_PAUSE_IN") == "step"
    armed = []  # in_step: this rank sleeps at its next send

    def say_pid() -> None:
        pid_file = os.path.join(os.environ["PIPESCHED_TEST_PAUSE_DIR"], f"rank{dist.get_rank()}.pid")
        with open(pid_file + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(pid_file + ".tmp", pid_file)

    def save_then_pause(directory, step, *args, **kwargs):
        path = original_save(directory, step, *args, **kwargs)
        if dist.is_initialized() and step == int(os.environ["PIPESCHED_TEST_PAUSE_STEP"]):
            paused = os.environ.get("PIPESCHED_TEST_PAUSE_RANKS")
            if paused is not None and str(dist.get_rank()) not in paused.split(","):
                say_pid()
            elif in_step:
                armed.append(True)
            else:
                say_pid()
                time.sleep(3600)
        return path

    def pause_then_send(self, msg, tensors):
        if armed:
            say_pid()
            time.sleep(3600)
        return original_send(self, msg, tensors)

    checkpoint.save = save_then_pause
    Transport.send = pause_then_send
