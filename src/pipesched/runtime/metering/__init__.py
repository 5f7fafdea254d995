"""Metering and timing: what a step holds in memory and when its actions ran.

- ``memory_meter``: activation bytes held, counted as the step runs (saved-tensor hooks, holds);
- ``clock``: host or CUDA-event timestamps of actions;
- ``exchange_waits``: the seconds a step waited on expert all-to-alls (the exposed time);
- ``observers``: the clock a step uses, the stage sizes learned on the first step, the step's result;
- ``timeline``: measured timelines replayed and compared with the simulator (pure Python).

Imports torch and pipesched's planning core (execution rules, the memory model); nothing else of
the runtime but its own modules.
"""
