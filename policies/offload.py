"""Offload: a batching policy whose memory pressure is met by moving KV to the host tier.

Built on continuous batching or chunked prefill (`base`). Under pressure a victim's blocks are
swapped out instead of discarded and swapped back in when room returns, paying link time
instead of recompute (seed 21.3). With prefix caching on, cached blocks evicted from the device
spill to the host and are reloaded on a later hit (`spill_prefix`). Transfer cost (link speed,
serial or overlapped with compute) is the cost model's: see `link` and `transfer_mode`.
"""

from __future__ import annotations

from typing import Literal

from policies.base import Scheduler
from policies.chunked_prefill import ChunkedPrefillPolicy
from policies.continuous import ContinuousPolicy

# Each base: its class, and the options of its own that offload passes on.
BASES = {
    "continuous": (ContinuousPolicy, ("mixed",)),
    "chunked_prefill": (ChunkedPrefillPolicy, ("chunk_size", "order")),
}


def make_offload(
    *args,  # noqa: ANN002 - SchedulerOptions and BlockManager, as for every policy
    base: Literal["continuous", "chunked_prefill"] = "chunked_prefill",
    spill_prefix: bool = True,
    chunk_size: int = 512,
    order: str = "stall_free",
    mixed: bool = False,
    **kwargs,  # noqa: ANN003
) -> Scheduler:
    """The base policy with swap preemption (and prefix spill), named offload."""
    if base not in BASES:
        raise ValueError(f"offload base must be one of {sorted(BASES)}, got {base!r}")
    given = {"chunk_size": chunk_size, "order": order, "mixed": mixed}
    base_class, own_options = BASES[base]
    policy = base_class(*args, **kwargs, **{name: given[name] for name in own_options})
    if policy.host is None:
        raise ValueError("the offload policy needs a host tier: set kv_cache.host_memory_gib > 0")
    policy.name = "offload"
    policy.options.preemption = "swap"
    if spill_prefix and policy.bm.enable_prefix_caching:
        policy.prefix.enable_spill()
    return policy
