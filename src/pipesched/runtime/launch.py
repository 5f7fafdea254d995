"""Start the ranks: spawn local processes (gloo, one thread each) or join torchrun's group.

Local runs pick a free port on 127.0.0.1, start one process per rank (one compute thread each,
freed memory kept for the next step) and watch them: when one fails or dies, the others are
expected to fail on their own within the timeout (their receives raise, naming the rank and
action they waited on); whatever is still alive 10 seconds later is killed (one second when the
failure was the rank's own, a misuse or a full disk, which the others only echo; at once when
those left are stopped by a signal and cannot answer). No rank outlives
the launcher: each dies with it (``lifeline``), and Ctrl-C, SIGTERM or SIGHUP on the launcher
stop every rank and raise ``RunStopped`` (KeyboardInterrupt for Ctrl-C) instead of a traceback.
A single rank has no peer whose silence would time it out: the launcher itself stops it when it
has not reported progress (:func:`report_progress`) for the timeout.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import threading
import time
import traceback
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist

from ..environment import backend as launch_backend, torchrun_rank
from ..errors import ConfigError, PipeschedError
from .lifeline import die_with_parent

Worker = Callable[[int, int, Any], Any]


class DistributedRunError(RuntimeError):
    """One or more ranks failed; the message names each rank and why."""


class RunStopped(BaseException):
    """The launcher was asked to stop (SIGTERM, SIGHUP); its ranks have been stopped.

    A BaseException, as KeyboardInterrupt is, so that no ``except Exception`` swallows it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal_name}")


STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextmanager
def stop_on_termination() -> Iterator[None]:
    """Within this block SIGTERM and SIGHUP raise RunStopped in the main thread, so that the
    run unwinds (stopping its ranks) and says why, instead of dying silently."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, _frame):
        raise RunStopped(signum)

    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def under_torchrun() -> bool:
    """Whether torchrun started this process (ConfigError for a partial torchrun environment)."""
    return torchrun_rank() is not None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


JOIN_TIMEOUT_S = 120.0


def init_group(rank: int, world: int, backend: str, timeout_s: float, *, host_store: bool = False) -> None:
    """Join the process group; ``timeout_s`` bounds every wait for a peer once joined.

    ``host_store`` (local ranks we spawned): rank 0 hosts the rendezvous store itself, and joining
    waits at least ``JOIN_TIMEOUT_S``: our ranks start seconds apart on a loaded machine (each
    imports torch), which a short ``--timeout`` meant for a silent peer must not turn into a
    failed start. Under torchrun its agent hosts the store, and its rendezvous bounds the join.
    """
    timeout = timedelta(seconds=timeout_s)
    if not host_store:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
        return
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=rank == 0,
        timeout=timedelta(seconds=max(timeout_s, JOIN_TIMEOUT_S)),
    )
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def run_torchrun(worker: Worker, payload: Any, timeout_s: float) -> Any:
    """Run ``worker`` in this process as torchrun's rank: NCCL on CUDA, one device per rank, or
    with ``PIPESCHED_BACKEND=gloo`` ranks that may share GPUs (tensors cross through host memory);
    gloo on CPU where there is no GPU."""
    rank, world, local = torchrun_rank()
    cuda = torch.cuda.is_available()
    backend = launch_backend(cuda=cuda)
    if cuda:
        count = torch.cuda.device_count()
        if backend == "nccl" and local >= count:
            raise ConfigError(
                f"NCCL needs one GPU per rank: local rank {local} but {count} GPU(s) here "
                "(PIPESCHED_BACKEND=gloo lets ranks share a GPU, slowly)"
            )
        torch.cuda.set_device(local % count)
    init_group(rank, world, backend, timeout_s)
    try:
        # every rank must run the same plan: take rank 0's (a time-bounded search such as
        # zb-auto's MILP refinement may end differently on different processes)
        shared = [payload]
        dist.broadcast_object_list(shared, src=0)
        return worker(rank, world, shared[0])
    finally:
        dist.destroy_process_group()


def rank_device() -> torch.device:
    """Where this rank computes: its GPU under torchrun on a CUDA machine, else the CPU
    (locally spawned ranks always run on the CPU)."""
    if under_torchrun() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# glibc's mallopt parameters, and the limits we set them to (bytes)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEEP_FREED_BYTES, MMAP_FROM_BYTES = 1 << 30, 32 << 20
memory_kept = False  # set in a process once keep_freed_memory() took effect


def keep_freed_memory() -> bool:
    """Keep freed memory in this process instead of handing it back to the OS (glibc only).

    By default glibc unmaps large freed blocks and trims the heap, so the next step's tensors
    fault their pages in again: thousands of page faults per step on our models, each one
    time taken from the compute. A training step allocates the same sizes every step, so the
    local ranks keep what they freed (as PyTorch's caching allocator does on GPUs): memory
    stays at the step's peak. Tensors over 32 MiB are still mapped and unmapped one by one.
    Returns whether it took effect. ``PIPESCHED_KEEP_FREED_MEMORY=0`` leaves glibc's defaults.
    """
    global memory_kept
    try:
        libc = ctypes.CDLL("libc.so.6")
        memory_kept = bool(libc.mallopt(M_TRIM_THRESHOLD, KEEP_FREED_BYTES)) and bool(
            libc.mallopt(M_MMAP_THRESHOLD, MMAP_FROM_BYTES)
        )
    except (OSError, AttributeError):  # not glibc (macOS, musl): leave the allocator alone
        memory_kept = False
    return memory_kept


_progress_to: Optional[Callable[[], None]] = None  # set in a spawned rank: says "alive" to the launcher


def report_progress() -> None:
    """Tell the launcher that this rank is making progress (before its first step, after each);
    a no-op outside a locally spawned rank. A single rank that has said so once and then stays
    silent for the timeout is stopped (workers that never say so are not watched)."""
    if _progress_to is not None:
        _progress_to()


def _child(rank: int, world: int, port: int, worker: Worker, payload: Any, timeout_s: float, results,
           launcher: int) -> None:
    global _progress_to
    die_with_parent(launcher)
    # Ctrl-C reaches the whole terminal's process group: the launcher alone handles it (and stops
    # us), so no rank prints a KeyboardInterrupt traceback. SIGINT was blocked across our start.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if os.environ.get("PIPESCHED_KEEP_FREED_MEMORY", "1") != "0":
        keep_freed_memory()
    try:
        init_group(rank, world, "gloo", timeout_s, host_store=True)
        _progress_to = lambda: results.put(("alive", rank, None))  # noqa: E731
        # plain pickle: tensors travel as bytes, not as shared-memory handles that die with us
        results.put(("ok", rank, pickle.dumps(worker(rank, world, payload))))
        dist.destroy_process_group()
    except BaseException as err:  # reported to the parent as one line (DCP's errors are BaseExceptions)
        if isinstance(err, SystemExit) and not err.code:
            raise
        results.put(("error" if _is_consequence(err) else "cause", rank, _one_line(err)))
        results.close()
        results.join_thread()
        os._exit(1)  # skip the group's teardown: its peers may be gone


CONSEQUENCES = ("Connection closed by peer", "Connection reset by peer", "timed out", "Timed out")


def _is_consequence(err: BaseException) -> bool:
    """Whether a rank's failure is another's consequence (a peer gone or silent) rather than
    a cause of its own (bad input, a misuse found on this rank, a full disk)."""
    if type(err).__name__ in ("PeerFailure", "DistributedRunError"):
        return True
    return isinstance(err, RuntimeError) and any(text in str(err) for text in CONSEQUENCES)


def _one_line(err: BaseException) -> str:
    """A rank's failure as one line: the message of pipesched's own errors (they are written to
    be read), else the exception's type, first line and where it was raised."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    known = ("PeerFailure", "NonFiniteLoss", "NonFiniteWeights", "DistributedRunError", "CheckpointWriteError")
    if type(err).__name__ in known or isinstance(err, PipeschedError):
        return text
    where = traceback.extract_tb(err.__traceback__)[-1] if err.__traceback__ else None
    at = f" ({os.path.basename(where.filename)}:{where.lineno})" if where else ""
    return f"{type(err).__name__}: {text}{at}"


def spawn(worker: Worker, world: int, payload: Any, timeout_s: float = 300.0) -> dict[int, Any]:
    """Run ``worker(rank, world, payload)`` in ``world`` local processes; return each rank's result.

    ``worker`` must be importable (defined at module level): processes are spawned, not forked.
    Raises DistributedRunError naming every rank that failed, RunStopped on SIGTERM or SIGHUP
    and KeyboardInterrupt on Ctrl-C (every rank stopped first). The calling thread must live
    until this returns (it does: it waits here), since on Linux the ranks die with it.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_child, args=(r, world, port, worker, payload, timeout_s, results, os.getpid()), daemon=True)
        for r in range(world)
    ]
    with stop_on_termination():
        try:
            _start_without_sigint(procs)
            return _collect(procs, results, timeout_s)
        finally:
            _stop(procs)


def _start_without_sigint(procs: list) -> None:
    """Start the ranks with SIGINT blocked (they inherit the mask until they ignore SIGINT)."""
    if not hasattr(signal, "pthread_sigmask"):
        for p in procs:
            p.start()
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for p in procs:
            p.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


FAILURE_GRACE_S = 10.0  # after a rank fails, how long the others get to say why they stopped
CAUSE_GRACE_S = 1.0  # ... when it failed of its own cause: the others only wait for it


def _collect(procs: list, results, timeout_s: float) -> dict[int, Any]:
    """Gather every rank's result; after the first failure, give the others a short grace to
    report why they stopped (a dead peer makes their receives fail at once), then stop them.
    A failure of a rank's own (a misuse, a full disk: not a peer's silence) gets them one
    second; ranks that cannot answer (stopped by SIGSTOP) none. A single rank silent for
    ``timeout_s`` since it last reported progress is stopped at once."""
    world = len(procs)
    done: dict[int, Any] = {}
    errors: dict[int, str] = {}
    causes: set[int] = set()  # ranks whose failure is their own
    echoes: set[int] = set()  # ranks that reported a peer's failure (gone, silent)
    heard: dict[int, float] = {}  # when each rank last reported progress
    failed_at: Optional[float] = None
    while len(done) + len(errors) < world:
        _drain(results, done, errors, causes, echoes, heard, wait=0.1)
        if world == 1 and 0 in heard and not done and not errors and time.monotonic() - heard[0] > timeout_s:
            errors[0] = f"rank 0 timed out after {timeout_s:g}s without progress (it has no peer to wait for) and was stopped"
        for rank, p in enumerate(procs):
            if rank not in done and rank not in errors and p.exitcode is not None:
                _drain(results, done, errors, causes, echoes, heard, wait=0.2)
                if rank not in done and rank not in errors:
                    errors[rank] = f"rank {rank} died ({_exit_text(p.exitcode)})"
        if errors and failed_at is None:
            failed_at = time.monotonic()
        if failed_at is None:
            continue
        waiting = [r for r in range(world) if r not in done and r not in errors]
        grace = min(timeout_s, CAUSE_GRACE_S if causes else FAILURE_GRACE_S)
        if time.monotonic() - failed_at > grace or all(_not_running(procs[r].pid) for r in waiting):
            for rank in waiting:
                why = " (it was not running: stopped by a signal)" if _not_running(procs[rank].pid) else ""
                errors[rank] = f"rank {rank} was stopped after the failure{why}"
    if causes:  # the others' reports only echo it ("Connection closed by peer")
        for rank in echoes:
            errors[rank] = f"rank {rank} was stopped after the failure"
    if errors:
        raise DistributedRunError(_failure_text(errors))
    return {rank: pickle.loads(blob) for rank, blob in done.items()}


def _not_running(pid: Optional[int]) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, SIGTSTP) and so cannot report (Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] in ("T", "t")


def _failure_text(errors: dict[int, str]) -> str:
    """One line: deaths first, then each distinct reason once (with the ranks that gave it)."""
    by_text: dict[str, list[int]] = {}
    for rank, text in sorted(errors.items()):
        by_text.setdefault(text, []).append(rank)
    parts = []
    for text, ranks in sorted(by_text.items(), key=lambda kv: ("stopped" in kv[0], "died" not in kv[0], kv[1])):
        if text.startswith("rank"):
            parts.append(text)
        else:
            parts.append(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {text}")
    return "; ".join(parts)


def _drain(results, done: dict, errors: dict, causes: set, echoes: set, heard: dict, wait: float) -> None:
    try:
        kind, rank, value = results.get(timeout=wait)
    except queue.Empty:
        return
    while True:
        if kind == "alive":
            heard[rank] = time.monotonic()
        else:
            (done if kind == "ok" else errors)[rank] = value
            if kind != "ok":
                (causes if kind == "cause" else echoes).add(rank)
        try:
            kind, rank, value = results.get_nowait()
        except queue.Empty:
            return


def _exit_text(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def _stop(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
            if _not_running(p.pid):  # a stopped process acts on SIGTERM only once continued
                os.kill(p.pid, signal.SIGCONT)
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
