"""Multi-turn sessions: each turn's prompt is the whole conversation so far plus a new message.

Turn k+1's content = turn k's content + ("out:<session>:<k>", output of turn k) + its new message,
so the prefix cache can reuse everything a session has already processed.

Arrivals are a static approximation: turn k+1 arrives think_time after turn k *arrives*. In a
real chat it arrives think_time after turn k *finishes*, which depends on the simulated engine.
For that closed loop each later turn also carries `parent_id` (turn k's request id) and
`think_time_s`, and each turn its `output_key`; `session_think_times` collects them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from simcore.errors import ConfigError
from simcore.request import Request, Segment
from workloads.arrivals import sample_arrivals
from workloads.durations import sample_durations
from workloads.lengths import sample_lengths
from workloads.prefix import draw_prefixes, prefix_segment
from workloads.spec import MAX_COUNT, WorkloadSpec
from workloads.streams import stream


def turn_index(turn_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(session index, turn number) of every turn, session-major, for sessions of the given sizes."""
    sessions = np.repeat(np.arange(len(turn_counts)), turn_counts)
    first = np.concatenate(([0], np.cumsum(turn_counts)[:-1])).astype(np.int64)
    return sessions, np.arange(len(sessions)) - first[sessions]


def session_table(
    *,
    starts: np.ndarray,
    turn_counts: np.ndarray,
    think_s: np.ndarray,
    new_segments: Sequence[tuple[Segment, ...]],
    output_lens: np.ndarray,
    output_keys: Sequence[str],
    session_ids: Sequence[str],
    heads: Sequence[tuple[Segment, ...]],
    max_tokens: int | None = None,
    new_lens: Sequence[int] | None = None,
) -> pd.DataFrame:
    """One row per turn, in session-then-turn order (not sorted by arrival).

    Per session: start time, number of turns, a leading content (shared prefix or ()).
    Per turn (flat, session-major): think time before it (ignored for turn 0), the content it
    adds before its output (and optionally its token count, to save recounting), its output
    length and the content key of that output.
    """
    sessions, turn = turn_index(turn_counts)
    first = np.flatnonzero(turn == 0)
    think = np.where(turn == 0, 0.0, think_s)
    with np.errstate(over="ignore", invalid="ignore"):  # sums past the float range: reported by the builder
        elapsed = np.cumsum(think)
        # Think times are >= 0, so the running sum never decreases and turns stay in order.
        arrival = starts[sessions] + (elapsed - elapsed[first][sessions])

    # The context carries what the user actually saw: the output capped by max_tokens.
    shown = output_lens if max_tokens is None else np.minimum(output_lens, max_tokens)
    segments: list[tuple[Segment, ...]] = []
    prompt_lens = np.empty(len(sessions), dtype=np.int64)
    shown_list = shown.tolist()
    if new_lens is None:
        new_lens = [sum(n for _, n in segs) for segs in new_segments]
    i = 0
    for s, count in enumerate(turn_counts.tolist()):
        context = heads[s]
        total = sum(n for _, n in context)
        for _ in range(count):
            context = context + new_segments[i]
            total += new_lens[i]
            segments.append(context)
            prompt_lens[i] = total
            context = context + ((output_keys[i], shown_list[i]),)
            total += shown_list[i]
            i += 1
    return pd.DataFrame({
        "arrival_s": arrival,
        "prompt_len": prompt_lens,
        "output_len": output_lens.astype(np.int64),
        "segments": segments,
        "session_id": [session_ids[s] for s in sessions.tolist()],
        "turn": turn.astype(np.int64),
        "output_key": list(output_keys),
        "think_time_s": think,
        # The previous turn's row (-1 for a first turn); rows are renumbered once sorted by arrival.
        "turn_row": np.arange(len(sessions)),
        "parent_row": np.where(turn == 0, -1, np.arange(len(sessions)) - 1),
    })


def synthetic_sessions(spec: WorkloadSpec, seed: int) -> pd.DataFrame:
    """The turns of `spec.sessions`, drawn with independent streams of `seed`."""
    sess = spec.sessions
    assert sess is not None and spec.arrivals is not None and spec.prompt_len is not None
    assert spec.output_len is not None
    num_sessions = sess.num_sessions
    starts = sample_arrivals(spec.arrivals, num_sessions, stream(seed, "arrivals"))
    turn_counts = sample_lengths(sess.turns, num_sessions, stream(seed, "turns"))
    num_turns = int(turn_counts.sum())
    if num_turns > MAX_COUNT:
        raise ConfigError("too many turns in all", where="workload.sessions",
                          expected=f"at most {MAX_COUNT} (num_sessions x turns)", found=num_turns)
    first_msgs = sample_lengths(spec.prompt_len, num_sessions, stream(seed, "prompt_len"))
    later_msgs = sample_lengths(sess.message_len or spec.prompt_len, num_turns, stream(seed, "message_len"))
    output_lens = sample_lengths(spec.output_len, num_turns, stream(seed, "output_len"))
    think_s = sample_durations(sess.think_time_s, num_turns, stream(seed, "think_time"))

    session_ids = [f"s{k}" for k in range(num_sessions)]
    sessions, turn = turn_index(turn_counts)
    msg_lens = np.where(turn == 0, first_msgs[sessions], later_msgs).tolist()
    sid_per_turn = [session_ids[s] for s in sessions.tolist()]
    turn_list = turn.tolist()
    keyed = list(zip(sid_per_turn, turn_list, strict=True))
    new_segments = [((f"msg:{sid}:{k}", n),) for (sid, k), n in zip(keyed, msg_lens, strict=True)]
    output_keys = [f"out:{sid}:{k}" for sid, k in keyed]

    if spec.prefix is not None:
        indices, prefix_lens = draw_prefixes(spec.prefix, num_sessions, seed)
        heads = [prefix_segment(k, prefix_lens) for k in indices.tolist()]
    else:
        heads = [()] * num_sessions
    return session_table(
        starts=starts, turn_counts=turn_counts, think_s=think_s, new_segments=new_segments,
        output_lens=output_lens, output_keys=output_keys, session_ids=session_ids, heads=heads,
        max_tokens=spec.max_tokens, new_lens=msg_lens,
    )


def session_predecessors(requests: Sequence[Request]) -> dict[int, int]:
    """{request_id of turn k+1: request_id of turn k} for every turn whose previous turn is present."""
    by_turn = {(r.session_id, r.turn): r.request_id for r in requests if r.session_id is not None}
    return {
        rid: by_turn[(sid, turn - 1)]
        for (sid, turn), rid in by_turn.items()
        if turn > 0 and (sid, turn - 1) in by_turn
    }


def session_think_times(requests: Sequence[Request]) -> dict[int, float]:
    """{request_id: think time before that turn}, for every turn whose previous turn is present.

    Generated sessions (synthetic, ShareGPT) carry the drawn think time on the request (with
    `parent_id` set). For a trace that only labels sessions, it is the gap between the logged
    arrivals, which also contains the previous turn's service time.
    """
    by_id = {r.request_id: r for r in requests}
    result = {}
    for rid, prev in session_predecessors(requests).items():
        request = by_id[rid]
        if request.parent_id is not None:
            result[rid] = request.think_time_s
        else:
            result[rid] = request.arrival_s - by_id[prev].arrival_s
    return result
