"""Sharded stages: FSDP2 and tensor parallelism inside a pipeline stage.

- ``sharded_mesh``: the process groups of a ``ParallelLayout`` (pp x dp_replicate x dp_shard x tp),
  a torch ``DeviceMesh`` per pipeline position;
- ``tp_plans``: what a tensor-parallel plan is and how it splits a stage's sub-modules column- or row-wise;
- ``model_plans``: which plan each model gets (gpt's; a Hugging Face config's declared plan and pipesched's overrides);
- ``tp_styles``: the ``parallelize_module`` style object behind each style name a plan uses;
- ``sharding``: ``shard_stage`` (TP, then ``fully_shard`` per block and stage) and a sharded
  stage's part in the program (``StageSharding``: UNSHARD, RESHARD, no-sync backwards, REDUCE_GRAD);
- ``tp_guard``: a plan that leaves a replicated parameter's gradient partial (different on the
  ``tp`` ranks), refused on every rank before the first update;
- ``sharded_measure``: the bytes a rank holds, measured (the prediction is
  :mod:`pipesched.sharded_bytes`'s);
- ``fake_mesh``: a tensor-parallel mesh on torch's fake process group, in one process: a stage
  parallelised on it before launch, on fake tensors, saves what a ``tp`` rank's saves.

Imports torch, the planning core, and of the runtime ``comm`` (the mesh) and ``engine`` (the
split backward's Linears).
"""
