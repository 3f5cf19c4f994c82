"""Request state: the engine's copy-on-arrival."""

from __future__ import annotations

import dataclasses

from simcore.request import Request, Status


def test_a_copy_has_every_field_and_shares_nothing_mutable():
    template = Request(7, 1.5, 12, 4, max_tokens=3, prompt_token_ids=(1, 2), segments=(("a", 12),),
                       cache_salt="s", adapter_id="lora", session_id="chat", turn=2, output_key="k",
                       parent_id=6, think_time_s=0.25)
    assert template.num_target_outputs == 3  # min(output_len, max_tokens)
    # A distinct value in every counter and time, so one copied into another shows.
    state = [f.name for f in dataclasses.fields(Request)
             if f.name.startswith(("num_", "first_", "prefill_", "last_", "finish_", "swap_", "recompute_"))]
    for index, name in enumerate(state):
        setattr(template, name, 100 + index)
    template.status, template.reject_reason = Status.RUNNING, "why"
    copy = template.copy()
    for field in dataclasses.fields(Request):
        assert getattr(copy, field.name) == getattr(template, field.name), field.name
    assert copy is not template
    copy.num_processed += 1
    assert template.num_processed != copy.num_processed
