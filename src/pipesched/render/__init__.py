"""Drawing timelines: SVG/PNG Gantt charts, the terminal view, Perfetto traces, the HTML report.

Every renderer draws a :class:`Timeline` (per-rank executed spans plus the stage placement), so
the simulator's prediction and a measured run go through the same code.
"""

from .timeline import Timeline, as_timeline

__all__ = ["Timeline", "as_timeline"]
