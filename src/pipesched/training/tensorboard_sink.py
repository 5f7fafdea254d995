"""``--tensorboard DIR``: each logging interval as TensorBoard scalars (under ``train/``,
``memory/`` and ``eval/``, the step as TensorBoard's step), written by rank 0.

TensorBoard's writer writes from a thread of its own: a write that fails there (a full disk, the
folder removed) prints that thread's traceback and comes back, as the same exception, at the next
write. Here it comes back as one warning line instead: the scalars stop, the run goes on (its
``--metrics`` file and report keep every figure), and the thread's traceback is not printed.
"""

from __future__ import annotations

import sys
import threading
from typing import Optional

SCALARS = ("loss", "lr", "grad_norm", "tokens_per_s", "tokens_per_s_per_device", "step_time_s", "mfu",
           "bubble_share", "simulated_bubble_share")
_WRITER_THREAD = "_AsyncWriterThread"  # tensorboard.summary.writer.event_file_writer's


class TensorBoardSink:
    """Rank 0's TensorBoard writer, or None once a write failed (said once, on stderr)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        _quiet_writer_threads()
        self.board = None
        self._guarded(self._open)

    def _open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.board = SummaryWriter(self.folder)

    def write(self, row: dict) -> None:
        """One logging interval's scalars, flushed at once."""
        if self.board is not None:
            self._guarded(lambda: self._add(row))

    def _add(self, row: dict) -> None:
        step = row["step"]
        for name in SCALARS:
            if name in row:
                self.board.add_scalar(f"train/{name}", row[name], step)
        for rank, peak in enumerate(row["peak_memory_bytes"]):
            self.board.add_scalar(f"memory/peak_bytes_rank{rank}", peak, step)
        if "eval_loss" in row:
            self.board.add_scalar("eval/loss", row["eval_loss"], row["eval_step"])
            self.board.add_scalar("eval/perplexity", row["eval_perplexity"], row["eval_step"])
        self.board.flush()

    def close(self) -> None:
        if self.board is not None:
            self._guarded(self.board.close)
        self.board = None

    def _guarded(self, write) -> None:
        """``write()``; on a failure, one warning line and no more scalars."""
        try:
            write()
        except Exception as err:  # what the writer's thread raised (an OSError, mostly), re-raised here
            board, self.board = self.board, None
            if board is not None:
                _abandon(board)
            print(f"pipesched: warning: --tensorboard {self.folder!r}: could not write ({_why(err)}); "
                  "the run goes on without its TensorBoard scalars (--metrics keeps every figure)",
                  file=sys.stderr, flush=True)


def _abandon(board) -> None:
    """Stop a failed writer's thread without another write (closing it would flush again)."""
    for writer in (getattr(board, "all_writers", None) or {}).values():
        worker = getattr(getattr(getattr(writer, "event_writer", None), "_async_writer", None), "_worker", None)
        if worker is not None and worker.is_alive():
            worker.stop()


def _why(err: Exception) -> str:
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}".rstrip(": ")


_previous_hook: Optional[object] = None


def _quiet_writer_threads() -> None:
    """Let TensorBoard's writer thread fail without a traceback (the sink reports its failure);
    every other thread's exception goes to the hook that was there."""
    global _previous_hook
    if _previous_hook is not None:
        return
    _previous_hook = threading.excepthook

    def hook(args) -> None:
        if type(args.thread).__name__ != _WRITER_THREAD:
            _previous_hook(args)

    threading.excepthook = hook
