"""servesim core: request state, KV accounting, paged block manager, event loop, metrics."""

__version__ = "0.1.0"
