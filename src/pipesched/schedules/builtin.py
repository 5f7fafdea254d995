"""Registers the built-in schedule families, simplest first."""

from __future__ import annotations

from ..registry import Family, register
from .. import auto
from . import dualpipe, dualpipev, gpipe, interleaved, interleaved_zb, one_f_one_b, v_family, zero_bubble

register(Family(
    name="gpipe", build=gpipe.build,
    summary="all forwards, then all backwards: the simplest to reason about, for experiments",
    placement="loop", split_backward=False, default_chunks=1, min_chunks=1, max_chunks=1,
    memory="m (every microbatch held)", torch_name="ScheduleGPipe",
))
register(Family(
    name="1f1b", build=one_f_one_b.build,
    summary="the reliable default: GPipe's bubble at p microbatches of memory instead of m",
    placement="loop", split_backward=False, default_chunks=1, min_chunks=1, max_chunks=1,
    memory="min(p, m)", torch_name="Schedule1F1B",
))
register(Family(
    name="interleaved-1f1b", build=interleaved.build_interleaved,
    summary="v chunks per rank cut 1F1B's bubble by v, at v times the messages (Megatron's VPP)",
    placement="loop", split_backward=False, default_chunks=2, min_chunks=2, max_chunks=None,
    memory="about p(1+1/v)", torch_name="ScheduleInterleaved1F1B", uses_memory_limit=True,
    search_width=interleaved.interleaved_search_width,
))
register(Family(
    name="looped-bfs", build=interleaved.build_looped_bfs,
    summary="breadth-first over chunks: interleaving's bubble with GPipe's memory (pairs with FSDP)",
    placement="loop", split_backward=False, default_chunks=2, min_chunks=1, max_chunks=None,
    memory="m", torch_name="ScheduleLoopedBFS",
))
register(Family(
    name="zb-h1", build=zero_bubble.build_h1,
    summary="zero bubble at 1F1B's memory: split backward, a third of 1F1B's bubble",
    placement="loop", split_backward=True, default_chunks=1, min_chunks=1, max_chunks=1,
    memory="p (as 1F1B)",
))
register(Family(
    name="zb-h2", build=zero_bubble.build_h2,
    summary="no bubble once iterations overlap, for about twice 1F1B's memory",
    placement="loop", split_backward=True, default_chunks=1, min_chunks=1, max_chunks=1,
    memory="about 2p (limit steers W deferral)", uses_memory_limit=True,
))
register(Family(
    name="zb-v", build=v_family.build_zb_v,
    summary="no bubble at 1F1B's memory: two chunks in a V, split backward (2x messages)",
    placement="v", split_backward=True, default_chunks=2, min_chunks=2, max_chunks=2,
    memory="p (as 1F1B); any limit >= 1 accepted", torch_name="ScheduleZBVZeroBubble",
    uses_memory_limit=True, uses_objective=True, search_width=v_family.zb_v_search_width,
))
register(Family(
    name="interleaved-zb", build=interleaved_zb.build,
    summary="interleaving plus split backward: the densest loop-placed schedule for large systems",
    placement="loop", split_backward=True, default_chunks=2, min_chunks=2, max_chunks=None,
    memory="p by default (limit steers W deferral)", torch_name="ScheduleInterleavedZeroBubble",
    uses_memory_limit=True, search_width=interleaved_zb.search_width,
))
register(Family(
    name="zb-auto", build=auto.build,
    summary="measured costs + a memory budget: searches loop and V placements; never slower than a handcrafted schedule that fits",
    placement="loop or v", split_backward=True, default_chunks=1, min_chunks=1, max_chunks=2,
    memory="memory limit (default p); needs >= 1", uses_memory_limit=True, uses_objective=True,
    searches_chunks=True, search_width=auto.search_width,
))
register(Family(
    name="v-half", build=v_family.build_v_half,
    summary="half of 1F1B's activations, about half its bubble: V placement, split backward",
    placement="v", split_backward=True, default_chunks=2, min_chunks=2, max_chunks=2,
    memory="(p+2)//2 (a lower limit >= 1 is honoured)", uses_memory_limit=True, uses_objective=True,
    search_width=v_family.v_pool_width,
))
register(Family(
    name="v-min", build=v_family.build_v_min,
    summary="a third of 1F1B's activations at about 1F1B's speed: V placement, split backward",
    placement="v", split_backward=True, default_chunks=2, min_chunks=2, max_chunks=2,
    memory="(p+4)//3 (a lower limit >= 1 is honoured)", uses_memory_limit=True, uses_objective=True,
    search_width=v_family.v_pool_width,
))
register(Family(
    name="dualpipev", build=dualpipev.build,
    summary="DeepSeek's DualPipeV: a V whose steady state overlaps one chunk's forward with the other's backward (hides MoE all-to-all)",
    placement="v", split_backward=True, default_chunks=2, min_chunks=2, max_chunks=2,
    memory="p + 1/2", torch_name="ScheduleDualPipeV",
))
register(Family(
    name="dualpipe", build=dualpipe.build,
    summary="DeepSeek's bidirectional DualPipe: two model copies fed from opposite ends, forward and backward overlapped; p even, 2x parameters",
    placement="v", split_backward=True, default_chunks=2, min_chunks=2, max_chunks=2,
    memory="p + 1 (m >= 2p), plus a second copy of the parameters", parameter_copies=2,
))
