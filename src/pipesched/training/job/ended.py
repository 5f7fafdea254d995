"""How a job ends early without a traceback: one line for its user and the exit status the
command line gives (a refusal before launch is a ConfigError instead: exit 2)."""

from __future__ import annotations


class JobEnded(Exception):
    """The job stopped: ``line`` (already worded, ``pipesched: ...``) said on stderr, ``code`` the
    exit status (1: the run failed or its results could not be written; 2: torch is not installed;
    130: stopped by Ctrl-C; 128 + N: stopped by signal N)."""

    def __init__(self, line: str, code: int) -> None:
        super().__init__(line)
        self.line = line
        self.code = code
