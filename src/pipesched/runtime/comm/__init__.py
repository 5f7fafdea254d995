"""Communication and reductions: the process groups and everything that crosses ranks.

- ``mesh``: the data x pipeline process mesh and its groups;
- ``p2p``: the links of a rank's program: posting receives, sending, waiting with a timeout;
- ``reduction``, ``grad_sync``, ``tied``: the one gradient reduction plan (replicas, model copies,
  tied groups as reduce items), its bucketed all-reduces, tied weights broadcast;
- ``agree``, ``agreement``: the step's loss and gradient norm on every rank; ranks agreeing on how
  the runtime was built and on each step's batch;
- ``latency``: the one-way point-to-point latency measured before training.

Imports torch, the planning core, and of the runtime ``program``, ``metering`` and ``stages``.
"""
