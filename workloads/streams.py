"""Named random streams: one generator per purpose, all derived from the experiment seed.

Each purpose (arrivals, prompt lengths, prefix choice, ...) gets its own stream so that changing
one distribution, or how many numbers it draws, never shifts the numbers another one sees.
"""

from __future__ import annotations

import zlib

import numpy as np

from simcore.errors import ConfigError


def stream(seed: int, purpose: str) -> np.random.Generator:
    """The generator for `purpose` under `seed`; same (seed, purpose) -> same numbers."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError("seed must be a non-negative integer", where="seed", found=seed)
    # crc32 rather than hash(): Python salts str hashes per process, which would break replay.
    return np.random.default_rng([int(seed), zlib.crc32(purpose.encode())])
