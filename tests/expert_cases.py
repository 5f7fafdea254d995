"""The rank workers of tests/test_expert_parallel.py, tests/test_expert_overlap.py and
benchmarks/expert_parallel.py, expert_overlap.py: MoE models trained with expert parallelism
inside their stages (spawned processes import this module by name)."""

from __future__ import annotations

import time

import torch

from hf_cases import STEPS, in_dtype, make_model, reference, sgd
from runtime_cases import relative_error


def expert_runs(rank: int, world: int, job: dict) -> dict:
    """For every (label, model kind, schedule, layout sizes) of ``job["runs"]``: train STEPS SGD
    steps of ``job["batches"]`` in float64 with pipesched.hf on a mesh of ``layout`` (``dp``,
    ``dp_shard``, ``tp``, ``ep``); rank 0 returns each run's losses, gathered gradients and gradient norm
    (first step) and weights, its step times, and every rank's measured and predicted state bytes."""
    import torch.distributed as dist

    from pipesched import hf
    from pipesched.parallel_layout import runtime_layout
    from pipesched.runtime.comm.mesh import init_pipeline_mesh
    from pipesched.runtime.options import RuntimeOptions
    from pipesched.runtime.sharding.sharded_mesh import init_sharded_mesh

    out, meshes = {}, {}
    for label, kind, schedule, sizes in job["runs"]:
        layout = runtime_layout(schedule.ranks, sizes.get("dp", 1), sizes.get("dp_shard", 1), sizes.get("tp", 1),
                                sizes.get("ep", 1))
        if layout not in meshes:  # every rank makes every mesh, in one order
            meshes[layout] = (init_sharded_mesh(layout, 60) if layout.sharded
                              else init_pipeline_mesh(layout.pp, layout.dp, 60, ep=layout.ep))
        model, batches = make_model(kind, torch.float64), job["batches"]
        with in_dtype(torch.float64):
            rt = hf.pipeline(model, schedule, optimizer=sgd, sample_batch=batches[0], mesh=meshes[layout],
                             options=RuntimeOptions(timeout_s=60))
            losses, grads, times = [], None, []
            for step, batch in enumerate(batches[:STEPS]):
                result = rt.step(batch)
                losses.append(result.loss)
                times.append(result.step_time)
                if step == 0:
                    grads, norm = rt.gather_gradients(), rt.runtime.grad_norm()
            params = rt.gather_state_dict()
        held = [None] * world
        dist.all_gather_object(held, rt.runtime.state_bytes())
        out[label] = {"losses": losses, "grads": grads, "params": params, "bytes": held, "step_times": times,
                      "grad_norm": norm}
    return out if rank == 0 else None


def overlap_runs(rank: int, world: int, job: dict) -> dict:
    """For every (label, model kind, dtype, recompute, interleave) of ``job["runs"]``: ``job["steps"]``
    SGD steps of ``job["batches"]`` under dualpipev on ``job["pp"]`` (2) pipeline x 2 data-parallel ranks with
    ``ep`` 2, each overlapped pair's halves interleaved at their exchanges or one after the other
    (``RuntimeOptions.interleave_pairs``; ``"alternate"``: interleaved on even steps, in turn on
    odd ones, the engine's switch set between steps). On the rank's device: its GPU under torchrun
    on a CUDA machine (benchmarks/gpu_check.sh), else the CPU. Rank 0 returns each run's losses, the last step's gathered
    gradients, the weights after, its step times, every rank's exposed exchange seconds and CPU
    seconds (the rank process's, its threads' included) per step; and how
    many times its pairs' halves handed the turn to each other (pair_turns.Turns.hand_over)."""
    import pipesched
    from pipesched import hf
    from pipesched.runtime.comm.mesh import init_pipeline_mesh
    from pipesched.runtime.engine import pair_turns
    from pipesched.runtime.launching.launch import rank_device
    from pipesched.runtime.options import RuntimeOptions

    handed = [0]
    own = pair_turns.Turns.hand_over

    def counted(turns) -> None:  # a hand-over to a half not yet finished: the halves alternate
        handed[0] += not turns.finished[3 - turns.turn]
        own(turns)

    pair_turns.Turns.hand_over = counted
    pp = job.get("pp", 2)
    mesh, out = init_pipeline_mesh(pp, 2, 60, ep=2), {}
    schedule = pipesched.build_schedule("dualpipev", pp, job.get("microbatches", 4))
    for label, kind, dtype, recompute, interleave in job["runs"]:
        model, batches, handed[0] = make_model(kind, dtype), job["batches"], 0
        options = RuntimeOptions(timeout_s=60, recompute=recompute, interleave_pairs=bool(interleave),
                                 device=rank_device())
        with in_dtype(dtype):
            rt = hf.pipeline(model, schedule, optimizer=sgd, sample_batch=batches[0], mesh=mesh, options=options)
            results, cpu = [], []
            for step, batch in enumerate(batches[:job["steps"]]):
                if interleave == "alternate":  # even steps interleaved, odd in turn: the machine's load on both
                    rt.runtime.engine.interleave_timeout_s = None if step % 2 else 60
                start = time.process_time()
                results.append(rt.step(batch))
                cpu.append(time.process_time() - start)
            grads, params = rt.gather_gradients(), rt.gather_state_dict()
        ranks = [None] * world  # every rank's (exposed exchange seconds, CPU seconds) per step
        torch.distributed.all_gather_object(ranks, ([r.exposed_exchange_s for r in results], cpu))
        out[label] = {"losses": [r.loss for r in results], "grads": grads, "params": params, "handed": handed[0],
                      "exposed": [r[0] for r in ranks], "cpu": [r[1] for r in ranks],
                      "step_times": [r.step_time for r in results]}
    return out if rank == 0 else None


def launch(runs: list, batches: list, ranks: int = 4, timeout_s: float = 400) -> dict:
    """rank 0's :func:`expert_runs` of ``runs`` (label, model kind, schedule, layout sizes), from one
    launch of ``ranks`` processes."""
    from pipesched.runtime.launching.launch import spawn

    return spawn(expert_runs, ranks, {"runs": runs, "batches": batches}, timeout_s=timeout_s)[0]


def check_equal_to_one_process(launched: dict, labels: list[str], batches: list, tol: float) -> None:
    """Assert that :func:`launch` ran exactly ``labels`` (each its model kind first) and that each
    equals the model in one process within ``tol``: losses, first gradients (every expert, in
    transformers' stacked layout), their norm (every expert counted once) and final weights."""
    import pytest

    assert set(launched) == set(labels)
    for label, got in launched.items():
        want = reference(make_model(label.split()[0], torch.float64), batches, optimizer="sgd")
        assert got["losses"] == pytest.approx(want["losses"], rel=tol), label
        assert got["grads"].keys() == want["grads"].keys(), label
        assert relative_error(got["grads"], want["grads"]) < tol, label
        norm = torch.cat([g.flatten() for g in want["step_grads"][0].values()]).norm().item()
        assert got["grad_norm"] == pytest.approx(norm, rel=tol), label
        assert relative_error(got["params"], want["params"]) < tol, label
