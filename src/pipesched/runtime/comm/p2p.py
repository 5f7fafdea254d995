"""Point-to-point transfers of one rank: receives posted where its program posts them, asynchronous sends.

Each directed link (src -> dst) gets its own two-rank process group, so on NCCL a pending receive
on one link never blocks a send on another (one stream per link), and on gloo every link has its
own connection. A receive is posted at its program's RECV (:mod:`.program` places them in each
link's order, ahead of the action that needs them, and says why a run cannot hang), and while
the rank waits for a message it posts every link's next few (posting early never blocks; done
in a wait, it costs no time), into buffers allocated then, which become the consuming stage's
input as they are (no copy). Sends and receives call each link's group directly. A
message is what crosses a stage edge for one microbatch, a :class:`~.boundary.Boundary`: one
receive and one send per entry (tag ``message tag x widest boundary + entry``; one tensor keeps
the message's own tag), none for a boundary of no entries (the gradients of an edge carrying no
differentiable entry). Sent tensors are held only until their send completes. Gloo moves host
memory only: ranks computing on GPUs over gloo (sharing a GPU, say) send a host copy and receive
into a host buffer that is copied to the device on arrival. Programs and links name pipeline
ranks; with data-parallel replicas (a :class:`~pipesched.runtime.comm.mesh.PipelineMesh`) each
replica has its own links, and messages go to the global rank of the pipeline rank in this
process's replica.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
import torch.distributed as dist

from ...actions import Action
from ...errors import RunFailure
from ..program.instructions import ACT, Message, RankProgram
from ..stages.boundary import Boundary

if TYPE_CHECKING:
    from .mesh import PipelineMesh


def _real_view(tensor: torch.Tensor) -> torch.Tensor:
    """A complex tensor travels as its real view (as dist.isend and dist.irecv send it)."""
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


class PeerFailure(RunFailure):
    """A rank waited too long for a message, or its peer went away."""


def make_link_groups(links: list[tuple[int, int]], timeout_s: float, mesh: Optional["PipelineMesh"] = None) -> dict[tuple[int, int], Any]:
    """One process group per directed link of every replica (creating a group takes the whole
    world: every rank must call this with the same links); returns this replica's, by pipeline ranks."""
    grids = mesh.grids if mesh is not None else ((tuple(range(dist.get_world_size())),),)
    mine = mesh.grid[mesh.dp_rank] if mesh is not None else grids[0][0]
    groups = {}
    for grid in grids:
        for ranks in grid:
            for src, dst in links:
                group = dist.new_group([ranks[src], ranks[dst]], timeout=timedelta(seconds=timeout_s))
                if ranks == mine:
                    groups[(src, dst)] = group
    return groups


def describe(msg: Message, global_rank: Callable[[int], int] = lambda pp_rank: pp_rank) -> str:
    """``msg`` in words, its sender named by its global rank (the launcher's and torchrun's
    numbering: under ``--dp``, ``--dp-shard`` or ``--tp`` a pipeline rank is several processes)."""
    what = "activation" if msg.kind == ACT else "input gradient"
    return f"the {what} of stage {msg.stage} microbatch {msg.microbatch} from rank {global_rank(msg.src)}"


class Transport:
    """Sends and receives of one rank for one step at a time, as its program (:mod:`.program`)
    posts, waits for and sends them."""

    def __init__(
        self,
        program: RankProgram,
        groups: dict[tuple[int, int], Any],
        shapes: dict[tuple[str, int], Boundary],
        device: torch.device,
        timeout_s: float,
        host_staging: Optional[bool] = None,
        global_rank: Callable[[int], int] = lambda pp_rank: pp_rank,
        lookahead: int = 4,
    ) -> None:
        self.rank = program.rank
        self.incoming = program.incoming()  # per source rank: the program's RECVs, in link order
        self.position = {msg: i for link in self.incoming.values() for i, msg in enumerate(link)}
        self.lookahead = lookahead
        self.posted: dict[int, int] = {}
        self.global_rank = global_rank
        self.groups = groups
        # each link's peer as its two-rank group numbers it: sends and receives call the group
        # directly, what dist.isend/irecv do after checks that hold for every message of a link
        self.peer = {link: dist.get_group_rank(group, global_rank(link[0] if link[1] == self.rank else link[1]))
                     for link, group in groups.items() if self.rank in link}
        self.device = device
        if host_staging is None:  # gloo cannot read or write device memory (link groups share its backend)
            host_staging = device.type != "cpu" and dist.get_backend() == "gloo"
        self.host_staging = host_staging
        self.buffer_device = torch.device("cpu") if host_staging else device
        self.timeout = timedelta(seconds=timeout_s)
        self.set_shapes(shapes)
        self.works: dict[Message, list[tuple[Any, torch.Tensor]]] = {}
        self.pending_sends: list[tuple[Any, torch.Tensor]] = []

    def set_shapes(self, shapes: dict[tuple[str, int], Boundary]) -> None:
        """The boundary of every (message kind, stage), as it travels (between steps: the
        microbatch shapes changed). Every rank sets the same shapes, so tags agree."""
        self.shapes = shapes
        self.width = max((len(b.entries) for b in shapes.values()), default=1) or 1

    def connect(self) -> None:
        """Open every link this rank is on, in one global order, before the first step.

        NCCL creates a link's communicator on its first send or receive, and creating it blocks
        until the peer takes part: left to the first step, rank 0 would wait to create link
        1->0 (its first posted receive) while rank 1 waits to create 0->1 (its own), a hang that
        torch's own pipelining also met. Every rank walks the links in the same sorted order with
        one blocking one-element send or receive each, so the links open pair by pair with no
        cycle. On gloo, whose groups connect when created, this costs one round trip per link.
        """
        probe = torch.zeros(1, device=self.buffer_device)
        for (src, dst), group in sorted(self.groups.items()):
            try:
                if self.rank == src:
                    dist.send(probe, dst=self.global_rank(dst), group=group)
                elif self.rank == dst:
                    dist.recv(probe, src=self.global_rank(src), group=group)
            except RuntimeError as err:
                peer = dst if self.rank == src else src
                raise PeerFailure(f"rank {self.global_rank(self.rank)} could not open its link with rank "
                                  f"{self.global_rank(peer)}: {err}") from None

    def start_step(self) -> None:
        """A new step: nothing posted yet (each receive is posted at its RECV, or earlier, while
        this rank waits for another)."""
        self.posted = {src: 0 for src in self.incoming}
        self.reached = {src: 0 for src in self.incoming}

    def post(self, msg: Message) -> None:
        """The program's RECV of ``msg``: post it (and the link's receives before it, in the
        program's order) into fresh buffers that become the consuming stage's input as they
        are. The link's next ``lookahead`` receives are posted later, while this rank waits
        (:meth:`receive`): posting costs the host tens of microseconds a message on gloo, which
        a wait hides and a busy rank would pay between its actions."""
        position = self.position[msg]
        self.reached[msg.src] = max(self.reached[msg.src], position + 1)
        self._post_through(msg.src, position)

    def _post_ahead(self) -> None:
        """While waiting: post every link's receives up to ``lookahead`` past its latest RECV
        (a sender whose receive is posted early can hand over its message before it is needed)."""
        for src, link in self.incoming.items():
            last = min(self.reached[src] + self.lookahead, len(link)) - 1
            if last >= self.posted[src]:
                self._post_through(src, last)

    def _post_through(self, src: int, last: int) -> None:
        link, group, peer, width, device = (self.incoming[src], self.groups[(src, self.rank)], self.peer[(src, self.rank)],
                                            self.width, self.buffer_device)
        for i in range(self.posted[src], last + 1):
            msg = link[i]
            posted = []
            for j, entry in enumerate(self.shapes[(msg.kind, msg.stage)].entries):
                buf = torch.empty(entry.shape, dtype=entry.dtype, device=device)
                posted.append((group.recv([_real_view(buf)], peer, msg.tag * width + j), buf))
            self.works[msg] = posted
        self.posted[src] = max(self.posted[src], last + 1)

    def receive(self, msg: Message, action: Action) -> list[torch.Tensor]:
        """The entries ``action`` needs (posted earlier), once they have arrived."""
        bufs = []
        for work, buf in self.works.pop(msg):
            if not work.is_completed():
                self._post_ahead()
            self._wait(work, f"at {action} for {describe(msg, self.global_rank)}")
            bufs.append(buf.to(self.device) if self.host_staging else buf)
        return bufs

    def send(self, msg: Message, tensors: list[torch.Tensor]) -> None:
        link = (self.rank, msg.dst)
        dst, group, width = self.peer[link], self.groups[link], self.width
        for j, tensor in enumerate(tensors):
            if self.host_staging:
                tensor = tensor.to("cpu", copy=True)  # waits for the tensor's kernels; gloo reads it later
            tensor = tensor.contiguous()  # a block may end in a view (a transpose); the receiver's buffer is dense
            work = group.send([_real_view(tensor)], dst, msg.tag * width + j)
            self.pending_sends.append((work, tensor))

    def release_sent(self) -> None:
        """Drop the buffers of completed sends."""
        if self.pending_sends:
            self.pending_sends = [p for p in self.pending_sends if not p[0].is_completed()]

    def finish_step(self) -> None:
        """Wait for every send of the step (their receivers have them once this returns)."""
        for work, _tensor in self.pending_sends:
            self._wait(work, "at the end of the step for its sends to be received")
        self.pending_sends = []
        if self.works:
            raise RuntimeError(f"rank {self.global_rank(self.rank)}: {len(self.works)} receives were never consumed")

    def _wait(self, work: Any, what: str) -> None:
        try:
            ok = work.wait(self.timeout)
        except RuntimeError as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            reason = re.sub(r"^\[[^\]]*\]\s*", "", reason)  # gloo's source-location prefix
            if "timed out" not in reason.lower():
                raise PeerFailure(f"rank {self.global_rank(self.rank)} gave up waiting {what}: {reason}") from None
            ok = False
        if ok is False:
            raise PeerFailure(f"rank {self.global_rank(self.rank)} timed out after {self.timeout.total_seconds():g}s "
                              f"waiting {what}")
