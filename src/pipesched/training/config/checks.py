"""The rules of the run's numeric options past a least whole number (a NaN learning rate, a seed
torch's generators refuse, ...), each ``(label, value)``: the label is the flag, or the key and
file a run file gave it in. :mod:`.run_config` declares which option takes which; a value is
checked where it is given (:func:`pipesched.declared.check_value`), before any process starts.
"""

from __future__ import annotations

import math

from ...bounds import MAX_TIMEOUT_S
from ...errors import ConfigError

FLOAT32_MAX = 3.4028234663852886e38
# numpy's seed range; every generator seed derived from one (seed + block for the weights,
# 1_000_003 * seed + step for the data) then stays inside torch.manual_seed's
MAX_SEED = 2**32 - 1


def check_lr(label: str, lr: float) -> None:
    if not (math.isfinite(lr) and 0 < lr <= FLOAT32_MAX):
        raise ConfigError(f"{label} must be a finite number above 0 (at most {FLOAT32_MAX:.3g}, float32's largest), got {lr:g}")


def check_timeout(label: str, timeout: float) -> None:
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_S):
        raise ConfigError(f"{label} must be a number of seconds above 0 and at most {MAX_TIMEOUT_S} (a year), got {timeout:g}")


def check_seed(label: str, seed: int) -> None:
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"{label} must be a whole number from 0 to {MAX_SEED}, got {seed}")


def check_positive(label: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{label} must be a finite number above 0, got {value:g}")


def check_share(label: str, share: float) -> None:
    if not (math.isfinite(share) and 0 < share < 1):
        raise ConfigError(f"{label} must be above 0 and below 1 (the share of --data held out), got {share:g}")


def check_weight_decay(label: str, value: float) -> None:
    if not (math.isfinite(value) and 0 <= value < 1):
        raise ConfigError(f"{label} must be from 0 to below 1, got {value:g}")
