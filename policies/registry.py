"""Policy registry: name -> class, imported on use."""

from __future__ import annotations

import importlib

POLICIES: dict[str, str] = {
    "static": "policies.static:StaticPolicy",
    "continuous": "policies.continuous:ContinuousPolicy",
    "chunked_prefill": "policies.chunked_prefill:ChunkedPrefillPolicy",
    "offload": "policies.offload:make_offload",
}


def policy_class(name: str):  # noqa: ANN201 - a class, or a factory taking the same arguments
    module_name, attr = POLICIES[name].split(":")
    return getattr(importlib.import_module(module_name), attr)


def make_policy(
    name: str,
    *,
    num_blocks: int,
    block_size: int = 16,
    prefix_caching: bool = False,
    num_host_blocks: int = 0,
    hasher=None,  # noqa: ANN001 - simcore.prefix.PrefixHasher
    emit_block_tables: bool = False,
    block_bytes: int = 0,
    free_block_order=None,  # noqa: ANN001
    track_block_ids: bool | None = None,
    **options,  # noqa: ANN003 - SchedulerOptions fields plus the policy's own
):  # noqa: ANN201
    """Build a policy with its block manager (and host tier), e.g. for tests and the runner.

    Block ids are tracked when something needs them (`track_block_ids=None` decides); otherwise
    blocks are only counted, which gives identical results faster.
    """
    from dataclasses import fields

    from policies.base import SchedulerOptions
    from policies.host_pool import HostPool
    from simcore.block_counter import BlockCounter
    from simcore.block_manager import BlockManager
    from simcore.prefix import PrefixHasher

    shared = {f.name for f in fields(SchedulerOptions)}
    scheduler = SchedulerOptions(**{k: v for k, v in options.items() if k in shared})
    own = {k: v for k, v in options.items() if k not in shared}
    if track_block_ids is None:
        # Physical ids matter only to shared blocks and a real engine's tables (a swap's copies
        # are counted: a cost model that reads their ids is a real engine's).
        track_block_ids = prefix_caching or emit_block_tables or free_block_order is not None
    if track_block_ids:
        bm = BlockManager(num_blocks, block_size, free_block_order=free_block_order,
                          enable_prefix_caching=prefix_caching)
    else:
        bm = BlockCounter(num_blocks, block_size)
    if prefix_caching and hasher is None:
        hasher = PrefixHasher(block_size)
    host = HostPool(num_host_blocks) if num_host_blocks > 0 else None
    return policy_class(name)(
        scheduler, bm, hasher=hasher, host=host, emit_block_tables=emit_block_tables, block_bytes=block_bytes, **own
    )
