"""Checkpoints (torch.distributed.checkpoint): saving, loading, verifying, naming, locking.

- ``checkpoint``: save and load a rank's part of any layout, rotation, ``latest``;
- ``checkpoint_files``: the step folders, their manifest and its verification;
- ``checkpoint_names``: what each tensor is called (a tied weight once, under its group's first name);
- ``checkpoint_pieces``: a rank's experts (``ep``) saved as their rows of the whole layer's tensors;
- ``checkpoint_strided``: interleaved tensor-parallel pieces (Phi-3's fused projections) saved whole along ``tp``;
- ``checkpoint_manifest``, ``checkpoint_writes``: a step's manifest, read with bounded work and
  trusted in nothing; writes whose failure names its cause (a full disk);
- ``folder_lock``: one run at a time writes a checkpoint folder.

Imports torch, the planning core, and of the runtime ``stages`` (block names).
"""
