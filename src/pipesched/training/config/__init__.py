"""A ``pipesched train`` run as one declared value, free of the command line (no typer here):

- ``run_config``: the tree of sections (:class:`~.run_config.RunConfig`), each field the one
  declaration of an option (default, help, range, rule);
- ``run_file``: a run as a TOML file (``--config`` reads one, ``--print-config`` writes one);
- ``checks``: the numeric options' rules past a least whole number.

``pipesched.cli.run_options`` generates the command's flags from the tree; the job
(:mod:`pipesched.training.job`) runs what the tree holds.
"""
