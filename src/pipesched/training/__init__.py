"""``pipesched train`` and what it trains: the run, its models, data and optimizers, the profile.

- ``train``: one run on every rank (``TrainConfig``, ``run``), the unpipelined reference;
- ``models``, ``model_def``, ``datasets``, ``optimizers``: the built-in models, what a model is to
  ``train``, their data, the optimizers by name;
- ``run_loop``, ``loop_options``, ``lr_schedule``, ``evaluation``, ``metrics``, ``model_flops``,
  ``progress_display``, ``tensorboard_sink``, ``run_gather``: around the steps: the
  learning-rate schedule, held-out evaluation, the metrics written and shown, what rank 0 brings
  back;
- ``report``: what a run leaves when it ends, however it ends: the summary, the report, the
  metrics file read back and continued after a resume;
- ``profile``: measured costs and sizes for the advisor (``advise --profile``, ``train -s auto``);
- ``launch_checks``: the layout and memory checks before any rank starts, which
  :func:`pipesched.hf.pipeline` makes too.

The application on top of the runtime (a library that imports none of it), ``pipesched.hf``,
``pipesched.data`` and the planning tools: may import any of them. Its lowest part,
``model_def`` and ``launch_checks``, imports only the runtime and the core, so that
``pipesched.hf`` can call the checks (``tests/test_layers.py``).
"""
