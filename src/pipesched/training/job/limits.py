"""``pipesched train``'s memory limits, one meaning per flag: ``--memory-limit`` the activations
per rank in M_B (as in every command that plans), ``--activation-limit`` the same in bytes (auto
and zb-auto measure the sizes), ``--rank-memory-limit`` all a sharded rank is predicted to hold.

A size given to ``--memory-limit`` (its old second and third meanings) still works for one
release, as the flag its case now has, with a one-line warning.
"""

from __future__ import annotations

from typing import Optional

from ...errors import ConfigError
from ...memory_limits import moved_size, parse_memory_limit, size_limit
from ...resolve import MEASURING
from ..config.run_config import RunConfig


def memory_limits(cfg: RunConfig) -> tuple[Optional[float], Optional[float], Optional[float]]:
    """(activations in M_B, activations in bytes, a sharded rank's bytes), each None where not given."""
    s = cfg.schedule
    limit, size = parse_memory_limit(s.memory_limit)
    activation, rank = s.activation_limit, s.rank_memory_limit
    measuring = s.csv is None and s.schedule.strip().lower() in MEASURING
    if size is not None:  # a size: the meaning it had by the layout and schedule
        if cfg.layout.sharded and not measuring:
            rank = moved_size("train", s.memory_limit, "--rank-memory-limit", rank)
        elif measuring:
            activation = moved_size("train", s.memory_limit, "--activation-limit", activation)
        else:
            raise ConfigError(f"--memory-limit {s.memory_limit}: a size in bytes needs --schedule auto or zb-auto "
                              "(--activation-limit: they measure the activations) or a sharded layout (--dp-shard, "
                              "--tp: --rank-memory-limit); with another schedule give M_B units, e.g. --memory-limit 2")
    if activation is not None and not measuring:
        raise ConfigError("--activation-limit needs --schedule auto or zb-auto (they measure the activations); with "
                          "another schedule give --memory-limit in M_B units, e.g. --memory-limit 2")
    if limit is not None and activation is not None:
        raise ConfigError("--memory-limit and --activation-limit both limit the activations: give one")
    if rank is not None and not cfg.layout.sharded:
        raise ConfigError("--rank-memory-limit goes with --dp-shard or --tp (a whole stage's memory is not predicted)")
    return limit, size_limit("--activation-limit", activation), size_limit("--rank-memory-limit", rank)

