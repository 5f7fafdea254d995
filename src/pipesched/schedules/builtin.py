"""Registers the built-in schedule families, simplest first (:mod:`pipesched` imports this).

Each registration says everything pipesched needs to know about a family; the builders here
only adapt a :class:`~pipesched.registry.BuildRequest` to the family module's own function.
"""

from __future__ import annotations

from typing import Iterator

from .. import auto
from ..auto.recompute import recompute_width
from ..registry import BuildRequest, Family, Placement, TorchCounterpart, ZbAutoCandidate, register
from ..schedule import Schedule
from . import dualpipe, dualpipev, gpipe, interleaved, interleaved_zb, one_f_one_b, v_family, zero_bubble
from .v_blocks import block_orders, v_half_offsets, v_min_offsets
from .v_compact import COMPACTION_COST, compacted_orders


def _zb_v_program(r: BuildRequest) -> Iterator[tuple[str, Schedule]]:
    """ZB-V's handcrafted program as it is (its builder would run the greedy search too)."""
    yield "zb-v", v_family.v_programs.schedule(r.ranks, r.microbatches, v_family.zb_v_orders(r.ranks, r.microbatches),
                                               "zb-v")


def _v_seed(name: str, make_orders, offsets):
    """A V program as a zb-auto seed: ``make_orders(ranks, microbatches, offsets)`` (the V
    family's schedule of it, with the runs simulating it there left: :data:`.v_family.v_programs`)."""
    def programs(r: BuildRequest) -> Iterator[tuple[str, Schedule]]:
        yield name, v_family.v_programs.schedule(r.ranks, r.microbatches, make_orders(r.ranks, r.microbatches, offsets),
                                                 name)
    return programs


register(Family(
    name="gpipe", build=lambda r: gpipe.build(r.ranks, r.microbatches),
    summary="all forwards, then all backwards: the simplest to reason about, for experiments",
    placement=Placement.LOOP, split_backward=False, default_chunks=1, min_chunks=1, max_chunks=1,
    memory="m (every microbatch held)",
    why="all forwards then all backwards: the same warm-up and drain bubble as 1F1B, "
        "and it holds every microbatch's activations (m M_B)",
    torch=TorchCounterpart("ScheduleGPipe", 1), zb_auto=ZbAutoCandidate(order=5),
))
register(Family(
    name="1f1b", build=lambda r: one_f_one_b.build(r.ranks, r.microbatches),
    summary="the reliable default: GPipe's bubble at p microbatches of memory instead of m",
    placement=Placement.LOOP, split_backward=False, default_chunks=1, min_chunks=1, max_chunks=1,
    memory="min(p, m)", chunks_hint="with chunks>=2 use interleaved-1f1b",
    why="one forward, one backward after the warm-up: it keeps the (p-1)(F+B+W) warm-up "
        "and drain bubble but frees activations early (p M_B)",
    torch=TorchCounterpart("Schedule1F1B", 1), zb_auto=ZbAutoCandidate(order=0),
))
register(Family(
    name="interleaved-1f1b",
    build=lambda r: interleaved.build_interleaved(r.ranks, r.microbatches, r.chunks, r.costs, r.memory_limit),
    summary="v chunks per rank cut 1F1B's bubble by v, at v times the messages (Megatron's VPP)",
    placement=Placement.LOOP, split_backward=False, default_chunks=2, min_chunks=2, max_chunks=None,
    memory="about p(1+1/v)", uses_memory_limit=True, chunks_hint="chunks=1 is plain 1f1b",
    why="{v} chunks per rank shrink the warm-up and drain bubble about {v}-fold, "
        "at about {msg}x 1F1B's point-to-point messages and a little more memory",
    torch=TorchCounterpart("ScheduleInterleaved1F1B"), zb_auto=ZbAutoCandidate(order=4), search_width=interleaved.interleaved_search_width,
    planning="search",
))
register(Family(
    name="looped-bfs", build=lambda r: interleaved.build_looped_bfs(r.ranks, r.microbatches, r.chunks),
    summary="breadth-first over chunks: interleaving's bubble with GPipe's memory (pairs with FSDP)",
    placement=Placement.LOOP, split_backward=False, default_chunks=2, min_chunks=1, max_chunks=None,
    memory="m",
    why="{v} chunks per rank, breadth first: interleaving's smaller bubble, but every "
        "microbatch stays in memory as in GPipe, and {msg}x the messages",
    torch=TorchCounterpart("ScheduleLoopedBFS"), zb_auto=ZbAutoCandidate(order=6),
))
register(Family(
    name="zb-h1", build=lambda r: zero_bubble.build_h1(r.ranks, r.microbatches),
    summary="zero bubble at 1F1B's memory: split backward, a third of 1F1B's bubble",
    placement=Placement.LOOP, split_backward=True, default_chunks=1, min_chunks=1, max_chunks=1,
    memory="p (as 1F1B)",
    why="the backward is split into input- and weight-gradient passes and the weight passes "
        "fill the drain, about a third of 1F1B's bubble at the same memory and messages",
    zb_auto=ZbAutoCandidate(order=1),
))
register(Family(
    name="zb-h2",
    build=lambda r: zero_bubble.build_h2(r.ranks, r.microbatches, costs=r.costs, memory_limit=r.memory_limit),
    summary="no bubble once iterations overlap, for about twice 1F1B's memory",
    placement=Placement.LOOP, split_backward=True, default_chunks=1, min_chunks=1, max_chunks=1,
    memory="about 2p (limit steers W deferral)", uses_memory_limit=True,
    why="split backward and a deeper warm-up remove the bubble once iterations overlap, "
        "for about twice 1F1B's activation memory",
    zb_auto=ZbAutoCandidate(order=2),
))
register(Family(
    name="zb-v",
    build=lambda r: v_family.build_zb_v(r.ranks, r.microbatches, r.costs, r.memory_limit, r.objective),
    summary="no bubble at 1F1B's memory: two chunks in a V, split backward (2x messages)",
    placement=Placement.V, split_backward=True, default_chunks=2, min_chunks=2, max_chunks=2,
    memory="p (as 1F1B); any limit >= 1 accepted", uses_memory_limit=True, uses_objective=True,
    why="two chunks per rank in a V with a split backward: no bubble at 1F1B's memory, "
        "for {msg}x 1F1B's point-to-point volume",
    torch=TorchCounterpart("ScheduleZBVZeroBubble", 2),
    zb_auto=ZbAutoCandidate(order=7, programs=_zb_v_program), search_width=v_family.zb_v_search_width,
    planning="greedy", searches_for=v_family.zb_v_searches,
))
register(Family(
    name="interleaved-zb",
    build=lambda r: interleaved_zb.build(r.ranks, r.microbatches, r.chunks, r.costs, r.memory_limit),
    summary="interleaving plus split backward: the densest loop-placed schedule for large systems",
    placement=Placement.LOOP, split_backward=True, default_chunks=2, min_chunks=2, max_chunks=None,
    memory="p by default (limit steers W deferral)", uses_memory_limit=True, chunks_hint="chunks=1 is zb-h1",
    why="{v} chunks per rank plus a split backward: interleaving's small warm-up "
        "and weight passes in the gaps, at about {msg}x 1F1B's messages",
    torch=TorchCounterpart("ScheduleInterleavedZeroBubble"), zb_auto=ZbAutoCandidate(order=3), search_width=interleaved_zb.search_width,
    planning="search",
))
register(Family(
    name="zb-auto", build=auto.build,
    summary="measured costs + a memory budget: searches loop and V placements; never slower than a handcrafted schedule that fits",
    placement=Placement.SEARCHED, split_backward=True, default_chunks=1, min_chunks=1, max_chunks=2,
    memory="memory limit (default p); needs >= 1", uses_memory_limit=True, uses_objective=True,
    searches_chunks=True,
    why="a cost-aware zero-bubble order found by search for these costs and this limit, "
        "so weight passes land exactly in the gaps the costs leave", search_width=auto.search_width,
    recompute_search_width=recompute_width, planning="auto",
))
register(Family(
    name="v-half",
    build=lambda r: v_family.build_budgeted("v-half", r.ranks, r.microbatches, r.costs, r.memory_limit, r.objective),
    summary="half of 1F1B's activations, about half its bubble: V placement, split backward",
    placement=Placement.V, split_backward=True, default_chunks=2, min_chunks=2, max_chunks=2,
    memory="(p+2)//2 (a lower limit >= 1 is honoured)", uses_memory_limit=True, uses_objective=True,
    why="a V schedule at about half 1F1B's activation memory that still removes about half "
        "its bubble, for {msg}x the point-to-point volume",
    zb_auto=(ZbAutoCandidate(order=8, programs=_v_seed("v-half block", block_orders, v_half_offsets)),
             ZbAutoCandidate(order=10, programs=_v_seed("v-half compacted", compacted_orders, v_half_offsets),
                             width=COMPACTION_COST)), search_width=v_family.v_pool_width, planning="greedy",
))
register(Family(
    name="v-min",
    build=lambda r: v_family.build_budgeted("v-min", r.ranks, r.microbatches, r.costs, r.memory_limit, r.objective),
    summary="a third of 1F1B's activations at about 1F1B's speed: V placement, split backward",
    placement=Placement.V, split_backward=True, default_chunks=2, min_chunks=2, max_chunks=2,
    memory="(p+4)//3 (a lower limit >= 1 is honoured)", uses_memory_limit=True, uses_objective=True,
    why="a V schedule at about a third of 1F1B's activation memory, about 1F1B's speed, "
        "for {msg}x the point-to-point volume",
    zb_auto=(ZbAutoCandidate(order=9, programs=_v_seed("v-min block", block_orders, v_min_offsets)),
             ZbAutoCandidate(order=11, programs=_v_seed("v-min compacted", compacted_orders, v_min_offsets),
                             width=COMPACTION_COST)), search_width=v_family.v_pool_width, planning="greedy",
))
register(Family(
    name="dualpipev", build=lambda r: dualpipev.build(r.ranks, r.microbatches),
    summary="DeepSeek's DualPipeV: a V whose steady state overlaps one chunk's forward with the other's backward (hides MoE all-to-all)",
    placement=Placement.V, split_backward=True, default_chunks=2, min_chunks=2, max_chunks=2,
    memory="p + 1/2",
    why="DualPipeV overlaps one microbatch's forward with another's backward in a V, "
        "shrinking the bubble for {msg}x the point-to-point volume",
    torch=TorchCounterpart("ScheduleDualPipeV", 2),
))
register(Family(
    name="dualpipe", build=lambda r: dualpipe.build(r.ranks, r.microbatches),
    summary="DeepSeek's bidirectional DualPipe: two model copies fed from opposite ends, forward and backward overlapped; p even, 2x parameters",
    placement=Placement.V, split_backward=True, default_chunks=2, min_chunks=2, max_chunks=2,
    memory="p + 1 (m >= 2p), plus a second copy of the parameters", parameter_copies=2,
))
