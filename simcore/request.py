"""Request state: processed positions and selected outputs kept apart (seed 21.1, 21.6).

A request knows `num_tokens = prompt_len + num_outputs` tokens. A forward pass *processes*
positions (computes and stores their KV); when a pass processes the last known token, its
logits *select* the next output. So prefill processes the prompt and selects output 1, and
output k gets KV only when a later pass processes it. A request stopping after N outputs ends
with prompt_len + N - 1 processed (cached) positions: the last selected token is never processed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields

# One piece of prompt content: (content key, number of tokens). Equal keys mean equal tokens,
# so prefix identity can be computed per block without materialising token ids (seed 21.4).
Segment = tuple[str, int]


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"
    UNFINISHED = "unfinished"
    # Its client gave up before it finished (`clients.timeout_s`): it left the engine then.
    TIMED_OUT = "timed_out"


@dataclass(eq=False, slots=True)
class Request:
    request_id: int
    arrival_s: float
    prompt_len: int
    # Outputs the workload says this request produces before it stops (EOS-like).
    output_len: int
    # Optional cap on outputs (max_tokens); the smaller of the two stops the request.
    max_tokens: int | None = None
    # Prompt content for prefix caching: explicit token ids, or segments of keyed content.
    prompt_token_ids: tuple[int, ...] | None = None
    segments: tuple[Segment, ...] | None = None
    cache_salt: str | None = None
    adapter_id: str | None = None
    session_id: str | None = None
    turn: int = 0
    # Content key of this request's generated tokens, so a later turn that repeats them as its
    # prompt can hit the blocks they filled (multi-turn sessions).
    output_key: str | None = None
    # Closed-loop sessions: this request arrives `think_time_s` after request `parent_id`
    # finishes (its arrival_s is then set by the engine), not at a fixed time.
    parent_id: int | None = None
    think_time_s: float = 0.0
    # Scheduling priority under `queue_order: priority`: lower values are served first (vLLM's
    # convention); ignored by the other orders.
    priority: int = 0

    # --- state, advanced by the policy ---
    status: Status = Status.WAITING
    num_processed: int = 0  # positions whose KV exists (includes prefix-cache hits)
    num_outputs: int = 0  # outputs selected so far
    num_cached_prefix: int = 0  # prompt positions served by the prefix cache at (re)admission
    num_preemptions: int = 0
    num_swaps: int = 0
    # Positions whose KV arrives with the request (a disaggregated cluster's transfer from the
    # replica that prefilled it): admission stores them without computing them.
    num_kv_ready: int = 0
    reject_reason: str | None = None

    # --- timestamps (simulated seconds) ---
    first_scheduled_s: float | None = None
    prefill_done_s: float | None = None
    # First and last output times (delivered); gaps between outputs go to the run's ItlLog.
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None

    # --- counters for metrics ---
    num_prefix_query_tokens: int = 0
    num_prefix_hit_tokens: int = 0
    num_recomputed_tokens: int = 0
    swap_delay_s: float = 0.0
    recompute_delay_s: float = 0.0

    # Outputs this request will produce: the workload's length, capped by max_tokens (derived
    # once; a disaggregated cluster's legs set their own).
    num_target_outputs: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        self.num_target_outputs = self.output_len if self.max_tokens is None else min(self.output_len, self.max_tokens)
        if self.prompt_len < 1:
            raise ValueError(f"request {self.request_id}: prompt_len must be >= 1, got {self.prompt_len}")
        if self.output_len < 1:
            raise ValueError(f"request {self.request_id}: output_len must be >= 1, got {self.output_len}")

    def copy(self) -> Request:
        """A shallow copy (the engine's copy-on-arrival): every field as it is, the derived one
        too (not through __init__, which would derive it again: a leg sets its own)."""
        new = object.__new__(Request)
        for name in _FIELD_NAMES:
            setattr(new, name, getattr(self, name))
        return new

    def prefill_leg(self) -> Request:
        """A copy that stops at its first output: its prefill on a disaggregated cluster's
        prefill replica."""
        leg = self.copy()
        leg.num_target_outputs = 1
        return leg

    def decode_leg(self, template: Request, arrived_s: float) -> Request:
        """This prefill leg (finished) continued on a decode replica: a copy with `template`'s
        outputs to go, its prompt's KV arriving with it, and its first output delivered at
        `arrived_s`, when that KV arrived."""
        leg = self.copy()
        leg.num_target_outputs = template.num_target_outputs
        leg.status, leg.num_processed, leg.finish_s = Status.WAITING, 0, None
        leg.num_kv_ready = self.prompt_len
        leg.first_token_s = leg.last_token_s = arrived_s
        return leg

    @property
    def num_tokens(self) -> int:
        """Known tokens: the prompt plus every selected output."""
        return self.prompt_len + self.num_outputs

    @property
    def num_pending(self) -> int:
        """Known tokens not yet processed; the next pass that covers them all selects an output."""
        return self.num_tokens - self.num_processed

    @property
    def num_final_positions(self) -> int:
        """Processed positions when the request stops: prompt + N - 1."""
        return self.prompt_len + self.num_target_outputs - 1

    @property
    def is_finished(self) -> bool:
        return self.num_outputs >= self.num_target_outputs

    @property
    def is_prefilling(self) -> bool:
        """True while the prompt (or a recompute of prompt + outputs) is not fully processed."""
        return self.num_outputs == 0 or self.prompt_len + self.num_outputs - self.num_processed > 1


_FIELD_NAMES = tuple(each.name for each in fields(Request))
