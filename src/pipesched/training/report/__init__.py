"""What ``pipesched train`` leaves behind when a run ends, however it ends: the summary on the
terminal and in ``--summary``, the ``--report`` page, and the ``--metrics`` file a resumed run
continues (``pipesched report --run`` draws a run from that file).

- ``metrics_file``: the ``--metrics`` file read back (bounded, every field checked) and continued
  after ``--resume``;
- ``outputs``: the terminal summary and the files written after the run;
- ``run_report``: the HTML report of a run.

The figures every one of them shows (the run's bubble, its median step, its layout) are computed
once, in :mod:`pipesched.render.run_figures`.

Importing this package does not import torch.
"""
