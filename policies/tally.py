"""What a policy's preemptions and swaps did over a run, for the run's summary."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Tally:
    # Preemptions by kind: "recompute" and "swap".
    preemptions: dict[str, int] = field(default_factory=lambda: {"recompute": 0, "swap": 0})
    blocks_swapped_out: int = 0  # to the host tier: victims' blocks, and prefix blocks it keeps
    blocks_swapped_in: int = 0  # from the host tier: victims coming back, and prefix hits there
    host_prefix_hit_blocks: int = 0  # prefix blocks found on the host tier and brought back
