"""The rank worker of tests/test_expert_checkpoints.py and benchmarks/expert_parallel.py's
checkpoint matrix: a MoE model trained with AdamW, checkpointed at one layout and resumed at
others (spawned processes import this module by name)."""

from __future__ import annotations

import torch

from hf_cases import adamw, in_dtype, make_model


def _mesh(meshes: dict, pp: int, sizes: dict):
    """The mesh of pp x ``sizes`` (``dp``, ``dp_shard``, ``tp``, ``ep``), made once (every rank makes every
    mesh, in one order)."""
    from pipesched.parallel_layout import runtime_layout
    from pipesched.runtime.comm.mesh import init_pipeline_mesh
    from pipesched.runtime.sharding.sharded_mesh import init_sharded_mesh

    layout = runtime_layout(pp, sizes.get("dp", 1), sizes.get("dp_shard", 1), sizes.get("tp", 1), sizes.get("ep", 1))
    if layout not in meshes:
        meshes[layout] = (init_sharded_mesh(layout, 60) if layout.sharded
                          else init_pipeline_mesh(layout.pp, layout.dp, 60, ep=layout.ep))
    return meshes[layout]


def expert_checkpoints(rank: int, world: int, job: dict) -> dict:
    """``job``: ``kind`` (an hf_cases model), ``schedule`` name, ``microbatches``, ``batches`` (two),
    ``folder``, ``saved_at`` (pp, sizes) and ``resumed`` (label -> (pp, sizes, checkpoint label it
    loads)); ``sizes``: ``dp``, ``dp_shard``, ``tp``, ``ep``, and ``m`` where the microbatches differ. In float64 throughout, with AdamW:

    - ``uninterrupted``: at ``saved_at``, step 1, checkpoint ``folder/uninterrupted``, step 2;
    - each resumed run: a model of other initial weights at its layout loads the named run's
      checkpoint (``"uninterrupted"`` or an earlier resumed label), checkpoints again at once
      (``folder/<label>``, nothing trained) and trains step 2; the first one also writes the
      loaded model with ``save_pretrained`` (``folder/<label>-hf``).

    Rank 0 returns each run's step-2 loss and gathered weights, and the checkpoint folders."""
    import pipesched
    from pipesched import hf
    from pipesched.runtime.options import RuntimeOptions

    batches, folder, meshes, out, saved = job["batches"], job["folder"], {}, {}, {}

    def pipeline(pp: int, sizes: dict, seed: int):
        schedule = pipesched.build_schedule(job["schedule"], pp, sizes.get("m", job["microbatches"]))
        return hf.pipeline(make_model(job["kind"], torch.float64, seed=seed), schedule, optimizer=adamw,
                           sample_batch=batches[0], mesh=_mesh(meshes, pp, sizes), options=RuntimeOptions(timeout_s=60))

    with in_dtype(torch.float64):
        rt = pipeline(*job["saved_at"], seed=0)
        rt.step(batches[0])
        saved["uninterrupted"] = str(hf.save_checkpoint(rt, f"{folder}/uninterrupted"))
        out["uninterrupted"] = {"loss": rt.step(batches[1]).loss, "params": rt.gather_state_dict()}
        for index, (label, (pp, sizes, source)) in enumerate(job["resumed"].items()):
            rt = pipeline(pp, sizes, seed=1 + index)  # other weights: what the checkpoint holds must replace them
            loaded_step = hf.load_checkpoint(rt, saved[source])
            saved[label] = str(hf.save_checkpoint(rt, f"{folder}/{label}"))
            if index == 0:
                hf.save_pretrained(rt, f"{folder}/{label}-hf")
            out[label] = {"loss": rt.step(batches[1]).loss, "params": rt.gather_state_dict(), "loaded_step": loaded_step}
    return {"runs": out, "checkpoints": saved} if rank == 0 else None


def entries(step_folder: str) -> dict:
    """Every model and optimizer entry of a DCP checkpoint, whole, read in this one process."""
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as scratch:
        dcp_to_torch_save(step_folder, f"{scratch}/all.pt")
        state = torch.load(f"{scratch}/all.pt", weights_only=False)
    return {f"{part}.{k}": v for part in ("model", "optim") for k, v in state[part].items()}


def differing(got: dict, want: dict) -> list[str]:
    """The entries of two checkpoints' :func:`entries` that are not bit for bit the same (a name in
    one only included)."""
    def same(a, b) -> bool:
        return torch.equal(a, b) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) else a == b

    return sorted(k for k in got.keys() | want.keys() if k not in got or k not in want or not same(got[k], want[k]))
