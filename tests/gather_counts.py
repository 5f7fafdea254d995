"""What sharded ranks gathered in each step, counted where it happens (a rank worker, by name).

:func:`counting_gathers` runs another worker of the pipelined launches with two counts per stage
and step: the ``UNSHARD`` instructions the engine ran, and the all-gathers FSDP actually started
for the stage's parameter groups (its own hooks' included: a compute reaching a stage its
program did not gather would gather it there). A run that gathers exactly where its program says
has, per stage, as many all-gathers as ``UNSHARD``s x groups.
"""

from __future__ import annotations

from collections import Counter


def counting_gathers(rank: int, world: int, job: tuple):
    """``job = (worker, payload, labels)``: ``worker(rank, world, payload)``, which builds one
    ``PipelineRuntime`` per label in order; rank 0's result gains, per label, ``gathered``: every
    rank's steps as ``{stage: (UNSHARDs run, all-gathers started, parameter groups)}``."""
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    from pipesched.runtime.engine.engine import Engine
    from pipesched.runtime.sharding.sharding import StageSharding, fsdp_modules

    worker, payload, labels = job
    runs: list[list[dict]] = []  # per engine in the order built, per step
    seen = {"unshards": Counter(), "gathers": Counter(), "stage_of": {}, "groups": Counter()}
    originals = Engine.__init__, Engine.run, Engine._unshard, FSDPParamGroup.unshard

    def built(engine, *args, **kwargs):
        originals[0](engine, *args, **kwargs)
        engine.counted_steps = []
        runs.append(engine.counted_steps)

    def run(engine, *args, **kwargs):
        groups = {s: [g for m in fsdp_modules(r.part.stage) for g in m._get_fsdp_state()._fsdp_param_groups]
                  for s, r in engine.runners.items() if isinstance(r.part, StageSharding)}
        seen["stage_of"] = {id(g): s for s, gs in groups.items() for g in gs}
        seen["unshards"].clear()
        seen["gathers"].clear()
        result = originals[1](engine, *args, **kwargs)
        engine.counted_steps.append({s: (seen["unshards"][s], seen["gathers"][s], len(gs)) for s, gs in groups.items()})
        seen["stage_of"] = {}
        return result

    def unshard_instruction(engine, ins, step):
        seen["unshards"][ins.stage] += 1
        originals[2](engine, ins, step)

    def gather(group, *args, **kwargs):
        idle = group._all_gather_result is None and not group.is_unsharded
        originals[3](group, *args, **kwargs)
        if idle and group._all_gather_result is not None and id(group) in seen["stage_of"]:
            seen["gathers"][seen["stage_of"][id(group)]] += 1

    Engine.__init__, Engine.run, Engine._unshard, FSDPParamGroup.unshard = built, run, unshard_instruction, gather
    try:
        out = worker(rank, world, payload)
    finally:
        Engine.__init__, Engine.run, Engine._unshard, FSDPParamGroup.unshard = originals
    assert len(runs) == len(labels), (len(runs), labels)
    every = [None] * world
    dist.all_gather_object(every, runs)
    if rank == 0:
        for i, label in enumerate(labels):
            out[label]["gathered"] = [steps[i] for steps in every]
    return out
