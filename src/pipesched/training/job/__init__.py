"""The train job: a run assembled from its :class:`~pipesched.training.config.run_config.RunConfig`,
checked and launched; ``pipesched train`` is a thin command over it.

- ``job``: the job's phases, from the checks without torch to the run (:func:`~.job.run_job`);
- ``checks``, ``limits``, ``loop``, ``data``, ``layout``, ``hf_model``: the options of one kind
  each, checked together before any process starts and turned into what the run takes;
- ``ended``, ``say``: how the job ends early and speaks to its user, without a command line.

The checks ``pipesched.hf.pipeline`` makes too are :mod:`pipesched.training.launch_checks`.
"""
