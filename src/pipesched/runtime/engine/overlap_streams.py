"""On CUDA, the two halves of an overlapped forward and backward (OVERLAP_F_B) on two streams.

The runtime runs a pair's halves one after the other from the host: the forward, then the
backward. On a CPU they then run one after the other (the CPU path stays sequential). On CUDA
the host only queues kernels, so queueing the forward half on a side stream lets the device run
it while the backward half's kernels run on the current stream: the side stream first waits for
everything queued before the pair (its inputs), and after the backward half the current stream
waits for the side stream (an event), so everything after the pair sees both halves done.

Autograd runs each backward kernel on the stream its forward ran on and makes the stream that
called ``backward`` wait for them, so a microbatch whose forward ran on the side stream still
hands its gradients over in order. The caching allocator reuses a block only on the stream that
allocated it; the side stream allocates only in forward halves, each of which first waits for
everything queued on the current stream, and the current stream waits for the side stream after
every pair, so a freed block is never reused before the kernels that read it are done.

Not measured yet: ``benchmarks/gpu_check.sh`` checks it (equivalence, time against sequential).
"""

from __future__ import annotations

from typing import Optional

import torch


class OverlapStreams:
    """Where each action's kernels go: a pair's forward half (its program instruction's ``half``
    1) on the side stream when asked for on CUDA (never elsewhere; off by default until a GPU run
    has checked it), everything else on the current stream."""

    def __init__(self, device: torch.device, enabled: bool = False) -> None:
        self.active = device.type == "cuda" and enabled
        self.device = device
        self.side = torch.cuda.Stream(device) if self.active else None
        self.main: Optional[torch.cuda.Stream] = None

    def enter(self, half: int) -> None:
        """Before a half (its input received): a forward half switches to the side stream once
        it has waited for what the current stream queued."""
        if half == 1:
            self.main = torch.cuda.current_stream(self.device)
            self.side.wait_stream(self.main)
            torch.cuda.set_stream(self.side)

    def leave(self, half: int) -> None:
        """After a half: a forward half switches back; after the backward half the current
        stream waits for the side stream (the pair is done)."""
        if half == 1:
            torch.cuda.set_stream(self.main)
        elif half == 2:
            self.main.wait_stream(self.side)
