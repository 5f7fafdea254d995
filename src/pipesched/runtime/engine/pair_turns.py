"""An overlapped pair's two halves interleaved at their all-to-alls (DualPipe's overlap, issue 40).

An ``OVERLAP_F_B`` pair is a forward of one microbatch and a backward of another on the same
rank, neither needing the other's result. Under expert parallelism each MoE layer of either half
starts an ``all_to_all`` (dispatch, then combine; the backward's are the same exchanges back) and
waits for it. Run one half after the other, the rank idles through every exchange. Interleaved,
as DeepSeek's DualPipe does, one half's exchange is in flight while the other half computes:
forward layer ``i``'s attention and router, its dispatch started; the backward half's next layer
(combine-grad, expert MLP-grad) until it starts its own exchange; the forward half's experts once
its dispatch has arrived, and so on, layer by layer.

**How**: :func:`run_interleaved` runs each half on a thread of its own, whole, and lets only one
of them run at a time (the *turn*). A half hands the turn over right after it starts an
exchange (:func:`await_exchange`, called by the exchange itself), and waits for the exchange
only when the turn comes back, once the other half has started an exchange of its own or has
finished. Each half is exactly the code run one after the other: the forward half is the
stage's forward, the backward half one ``torch.autograd.backward`` of the stage's outputs,
suspended inside the exchange's autograd function. So every half computes the same operations
in the same order, and the result is bitwise that of the halves run one after the other; only
when each of them runs changes.

Why threads and not the backward driven layer by layer (``autograd.backward`` on each layer's
saved output) or through hooks: a per-layer backward needs the forward cut at every layer
(detached boundaries the stage does not have, and which a recomputed stage, a sharded stage's
FSDP hooks and a split ``I``/``W`` would each have to learn), and a hook can run the other half
only inside itself, nesting the forward inside the backward. Suspending a half at its own
exchange needs neither: recomputation included (a recomputed layer's forward is part of the
backward half, its exchanges hand the turn over like the others), split backwards included.

Every rank of an EP group runs the same program, and the turns change hands at the same
exchanges on each, so the ranks start their exchanges in one order: they pair one for one.
Thread-local state: the stage runner enters autocast and the meter's hooks inside each half;
the helper thread takes the rest from the caller (:func:`_caller_state`).
RNG: the halves share the process's generators; a half that draws (dropout) while the other
half's recomputation has set them (checkpoint restores the state it saved) would draw other
numbers, so the interleaving promises bitwise equality only for models that draw nothing in
training or stages not recomputed.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import torch

from ..metering.exchange_waits import EXCHANGE_WAITS

_PAIR: Optional["Turns"] = None  # the pair this process runs interleaved now (one engine per process)


class Turns:
    """Which half of a pair may run (1 forward, 2 backward); ``timeout_s`` bounds each wait."""

    def __init__(self, timeout_s: float) -> None:
        self._cond = threading.Condition()
        self.turn = 1
        self.finished = {1: False, 2: False}
        self.timeout_s = timeout_s

    def hand_over(self) -> None:
        """The running half gives the turn to the other (unless it has finished) and waits for it back."""
        with self._cond:
            me = self.turn
            if self.finished[3 - me]:
                return
            self.turn = 3 - me
            self._cond.notify_all()
            self._wait_for(me)

    def begin(self, half: int) -> None:
        with self._cond:
            self._wait_for(half)

    def end(self, half: int) -> None:
        """``half`` is done (or failed): the other runs on to its end without handing over."""
        with self._cond:
            self.finished[half] = True
            self.turn = 3 - half
            self._cond.notify_all()

    def _wait_for(self, half: int) -> None:
        if not self._cond.wait_for(lambda: self.turn == half or self.finished[3 - half], self.timeout_s):
            raise TimeoutError(f"half {half} of an interleaved pair waited {self.timeout_s:g} s for its turn")
        self.turn = half


def await_exchange(work: Any) -> None:
    """Wait for an exchange just started (``work``: its async handle): in an interleaved pair,
    after the other half has had its turn; the wait is counted as exposed time."""
    pair = _PAIR
    if pair is not None:
        pair.hand_over()
    EXCHANGE_WAITS.wait(work)


def run_interleaved(forward: Callable[[], Any], backward: Callable[[], Any], timeout_s: float,
                    finished: Callable[[int], None]) -> tuple[Any, Any]:
    """Run a pair's ``forward`` and ``backward`` halves interleaved at their exchanges (module doc);
    ``finished(half)`` is called as each half ends (before the other resumes). Returns both results;
    the first failure is raised once both halves have stopped."""
    global _PAIR
    turns = Turns(timeout_s)
    results: dict[int, Any] = {}
    errors: list[BaseException] = []
    inherit = _caller_state()

    def half(index: int, body: Callable[[], Any]) -> None:
        try:
            if index == 1:
                inherit()
            turns.begin(index)
            results[index] = body()
            finished(index)
        except BaseException as error:  # re-raised by the caller once both halves stopped
            errors.append(error)
        finally:
            turns.end(index)

    _PAIR = turns
    helper = threading.Thread(target=half, args=(1, forward), name="pipesched-forward-half", daemon=True)
    try:
        helper.start()
        half(2, backward)
        helper.join()
    finally:
        _PAIR = None
    if errors:
        raise errors[0]
    return results[1], results[2]


def _caller_state() -> Callable[[], None]:
    """What the calling thread's torch state is that a helper thread would not have (thread-local
    in torch): returns the function that gives it to the helper. The torch-function modes (a
    float64-throughout mode, say), grad mode, the intra-op thread count and, on CUDA, the device
    and current stream. The helper thread ends with the pair: its state goes with it."""
    modes = torch.overrides._get_current_function_mode_stack()
    grad, threads = torch.is_grad_enabled(), torch.get_num_threads()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    device, stream = (torch.cuda.current_device(), torch.cuda.current_stream()) if cuda else (None, None)

    def give() -> None:
        for mode in modes:
            torch._C._push_on_torch_function_stack(mode)
        torch.set_grad_enabled(grad)
        torch.set_num_threads(threads)
        if cuda:
            torch.cuda.set_device(device)
            torch.cuda.set_stream(stream)

    return give
