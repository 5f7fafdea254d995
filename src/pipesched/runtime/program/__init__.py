"""Each rank's program: the instructions it runs in one step, how a schedule is lowered to them,
and the checks that they cannot hang.

- ``instructions``: ``Instruction`` (an ``Op`` on a stage and microbatch), ``Message``, ``RankProgram``;
- ``passes``: lowering as a list of pure passes (torch's ``_add_unshard_reshard``,
  ``_add_reduce_grad``, ``_add_send_recv``), a new instruction's pass goes here;
- ``program``: ``lower_all`` (the passes, cached per schedule), ``assemble`` (a program read from a CSV),
  ``placing_gathers`` (a schedule carrying a CSV's or a plan's gathers, which the lowering keeps);
- ``program_check``: run the programs under the strictest transport rules and name what is wrong;
- ``planned_gathers``: ``plan_programs``, each rank's ``UNSHARD``/``RESHARD`` by torch's window or
  placed from the costs (``pipesched.gather_plan``), timed by the simulator.

Pure Python: imports nothing of torch, only pipesched's planning core (actions, ops, execution
rules, schedule; and, for ``planned_gathers``, the simulator and ``pipesched.gather_plan``). Nothing
else of the runtime.
"""
