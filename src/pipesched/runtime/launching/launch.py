"""Start the ranks: local processes (gloo, one thread each; forked from the launcher where that is
safe, :mod:`.rank_start`) or join torchrun's group.

Local runs host the group's rendezvous store in the launcher, on a port the store binds itself
(no port is looked up and bound later: another run on the host cannot take it in between, nor
can a rank join another run's store), start one process per rank (one compute thread each,
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
import signal
import threading
import traceback
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist

from ...bounds import DEFAULT_TIMEOUT_S
from ...environment import backend as launch_backend
from ...environment import torchrun_rank
from ...errors import ConfigError, PipeschedError
from .lifeline import die_with_parent
from .rank_start import as_a_fresh_rank, forking_environment, start_method, warn_if_oversubscribed
from .rank_watch import FAILURE_GRACE_S, DistributedRunError, collect, stop  # noqa: F401  (re-exported)
from .rendezvous import joining

Worker = Callable[[int, int, Any], Any]


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


JOIN_TIMEOUT_S = 120.0


def init_group(rank: int, world: int, backend: str, timeout_s: float, *, spawned: bool = False) -> None:
    """Join the process group; ``timeout_s`` bounds every wait for a peer once joined.

    ``spawned`` (local ranks we started): the launcher hosts the store (:func:`_hosted_store`) at
    ``MASTER_ADDR:MASTER_PORT``, and joining waits at least ``JOIN_TIMEOUT_S``: our ranks start
    seconds apart on a loaded machine (each imports torch), which a short ``--timeout`` meant for
    a silent peer must not turn into a failed start. Under torchrun its agent hosts the store, and
    its rendezvous bounds the join.

    Every group, this one and each ``new_group`` after it, is left only once all its ranks have
    joined it (torch's store-based barrier, ``TORCH_DIST_INIT_BARRIER=1``, unless set otherwise).
    Without it a rank with nothing to say to a peer may finish and close its connections while
    that peer is still connecting; gloo then fails the peer's join with "Connection closed by
    peer" (7 of 216 two-rank runs side by side on a loaded 2-core machine; benchmarks/join_race.py).
    """
    os.environ.setdefault("TORCH_DIST_INIT_BARRIER", "1")
    timeout = timedelta(seconds=timeout_s)
    if not spawned:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=max(timeout_s, JOIN_TIMEOUT_S)))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def _hosted_store() -> dist.TCPStore:
    """The rendezvous store of one local run, hosted by the launcher on a port it binds itself
    (port 0: the system's choice, held until the run ends)."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


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
    with joining(rank, world, timeout_s):  # bounded, and one line naming the address
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
           launcher: int, started) -> None:
    global _progress_to
    die_with_parent(launcher)
    as_a_fresh_rank()
    # Ctrl-C reaches the whole terminal's process group: the launcher alone handles it (and stops
    # us), so no rank prints a KeyboardInterrupt traceback. SIGINT was blocked across our start.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    started.wait(timeout_s)  # every sibling started before any of us talks to the store (see spawn)
    torch.set_num_threads(1)
    if os.environ.get("PIPESCHED_KEEP_FREED_MEMORY", "1") != "0":
        keep_freed_memory()
    try:
        init_group(rank, world, "gloo", timeout_s, spawned=True)
        _progress_to = lambda: results.put(("alive", rank, None))  # noqa: E731
        # plain pickle: tensors travel as bytes, not as shared-memory handles that die with us
        results.put(("ok", rank, pickle.dumps(worker(rank, world, payload))))
        dist.destroy_process_group()
    except BaseException as err:  # reported to the parent as one line (DCP's errors are BaseExceptions)
        if isinstance(err, SystemExit) and not err.code:
            raise
        kind, line = failure_report(err)
        results.put((kind, rank, line))
        results.close()
        results.join_thread()
        os._exit(1)  # skip the group's teardown: its peers may be gone


def failure_report(err: BaseException) -> tuple[str, str]:
    """What a failed rank tells the launcher (:func:`~.rank_watch.collect`): its kind, ``"refused"``
    (bad input: one of pipesched's own errors), ``"error"`` (another rank's failure echoed) or
    ``"cause"`` (a failure of its own), and the failure in one line."""
    kind = "refused" if isinstance(err, PipeschedError) else "error" if _is_consequence(err) else "cause"
    return kind, _one_line(err)


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


def spawn(worker: Worker, world: int, payload: Any, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[int, Any]:
    """Run ``worker(rank, world, payload)`` in ``world`` local processes; return each rank's result.

    ``worker`` must be importable (defined at module level): where ranks are spawned rather than
    forked (:mod:`.rank_start`), each imports it. ``world`` above the cores available gets one
    line of warning on stderr.
    Raises DistributedRunError naming every rank that failed (:class:`~.rank_watch.RanksRefused`,
    a ConfigError, when the only cause was bad input a rank refused), RunStopped on SIGTERM or SIGHUP
    and KeyboardInterrupt on Ctrl-C (every rank stopped first). The calling thread must live
    until this returns (it does: it waits here), since on Linux the ranks die with it.
    """
    warn_if_oversubscribed(world)
    store = _hosted_store()  # lives until every rank is done
    method = start_method()
    ctx = mp.get_context(method)
    results = ctx.Queue()
    # No rank connects to the store until every rank is started: a rank forked while the store's
    # thread served a sibling's connection (inside glibc's resolver, for the peer's name) inherited
    # that lock held, and hung at its own connect (seen under load with 8 forked ranks).
    started = ctx.Event()
    procs = [
        ctx.Process(target=_child, args=(r, world, store.port, worker, payload, timeout_s, results, os.getpid(), started),
                    daemon=True)
        for r in range(world)
    ]
    with stop_on_termination():
        try:
            with forking_environment(method):
                _start_without_sigint(procs)
            started.set()
            return collect(procs, results, timeout_s)
        finally:
            stop(procs)


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
