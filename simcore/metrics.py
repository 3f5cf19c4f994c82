"""Per-request records and summaries, named as vLLM's `bench serve` names them.

TTFT = first output - arrival = queue (arrival -> first scheduled) + prefill (-> logits of the
last prompt position) + delivery (selection/delivery overhead), seed eq. 21.4.
TPOT = (t_N - t_1) / (N - 1), undefined for N = 1 (eq. 21.5). ITL = gaps between output events.
E2EL = last output - arrival. Throughputs divide by the observed duration (first arrival to
last finish); goodput counts requests meeting every SLO.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

import numpy as np
import pandas as pd

from simcore.itl import ItlLog, mean_and_std, weighted_stats
from simcore.request import Request

PERCENTILES = (50, 90, 95, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


def ttft_parts(queue_s: float, prefill_s: float, delivery_s: float) -> float:
    """Eq. 21.4: the three non-overlapping terms of a server-side TTFT."""
    return queue_s + prefill_s + delivery_s


def tpot(first_token_s: Any, last_token_s: Any, num_outputs: Any) -> Any:
    """Eq. 21.5: mean time per output token after the first; NaN for a one-token response.
    Numbers give a float; arrays (one entry per request) give an array."""
    outputs = np.asarray(num_outputs)
    with np.errstate(invalid="ignore"):  # NaN times stay NaN
        per_token = np.where(outputs >= 2, (np.asarray(last_token_s) - first_token_s) / np.maximum(outputs - 1, 1),
                             math.nan)
    return float(per_token) if per_token.ndim == 0 else per_token


def output_throughput(num_output_tokens: int, duration_s: float) -> float:
    """Aggregate output tokens per second (not any one request's TPOT, seed 21.2)."""
    return num_output_tokens / duration_s if duration_s > 0 else math.nan


REQUEST_COLUMNS = (
    "request_id", "status", "reject_reason", "arrival_s", "prompt_len", "output_len", "num_outputs",
    "first_scheduled_s", "prefill_done_s", "first_token_s", "last_token_s", "finish_s",
    "queue_s", "prefill_s", "delivery_s", "ttft_s", "tpot_s", "e2el_s",
    "num_preemptions", "num_swaps", "num_cached_prefix_tokens", "num_prefix_query_tokens",
    "num_prefix_hit_tokens", "num_recomputed_tokens", "swap_delay_s", "recompute_delay_s",
    "session_id", "turn", "cache_salt", "adapter_id",
)


def request_frame(requests: Sequence[Request]) -> pd.DataFrame:
    if not requests:
        return pd.DataFrame.from_records([], columns=list(REQUEST_COLUMNS))
    return pd.DataFrame(request_columns(requests), columns=list(REQUEST_COLUMNS))


# Columns that are a request's field as it is: the field of the column's name, or the one named here.
_FIELD_COLUMNS = {
    "request_id": "request_id", "reject_reason": "reject_reason", "arrival_s": "arrival_s",
    "prompt_len": "prompt_len", "output_len": "num_target_outputs", "num_outputs": "num_outputs",
    "num_preemptions": "num_preemptions", "num_swaps": "num_swaps", "num_cached_prefix_tokens": "num_cached_prefix",
    "num_prefix_query_tokens": "num_prefix_query_tokens", "num_prefix_hit_tokens": "num_prefix_hit_tokens",
    "num_recomputed_tokens": "num_recomputed_tokens", "swap_delay_s": "swap_delay_s",
    "recompute_delay_s": "recompute_delay_s", "session_id": "session_id", "turn": "turn",
    "cache_salt": "cache_salt", "adapter_id": "adapter_id",
}


def request_columns(requests: Sequence[Request]) -> dict[str, list | np.ndarray]:
    """The rows of `request_frame` as columns, in REQUEST_COLUMNS order: lists of the fields as
    they are; numpy arrays for times, a missing one NaN, and the latencies derived from them."""
    columns: dict[str, list | np.ndarray] = {
        name: list(map(attrgetter(field), requests)) for name, field in _FIELD_COLUMNS.items()}
    columns["status"] = [request.status.value for request in requests]

    def times(field: str) -> np.ndarray:
        return np.array(list(map(attrgetter(field), requests)), dtype=np.float64)  # None -> NaN

    scheduled, prefill_done, first, last = (times(field) for field in (
        "first_scheduled_s", "prefill_done_s", "first_token_s", "last_token_s"))
    arrivals = np.array(columns["arrival_s"], dtype=np.float64)
    columns.update({
        "first_scheduled_s": scheduled, "prefill_done_s": prefill_done, "first_token_s": first,
        "last_token_s": last, "finish_s": times("finish_s"),
        "queue_s": scheduled - arrivals, "prefill_s": prefill_done - scheduled, "delivery_s": first - prefill_done,
        "ttft_s": first - arrivals, "tpot_s": tpot(first, last, np.array(columns["num_outputs"], dtype=np.int64)),
        "e2el_s": last - arrivals,
    })
    return {name: columns[name] for name in REQUEST_COLUMNS}


# Token columns, present only when the engine recorded its tokens (a run of millions of requests
# without them pays nothing). Each cell is an int64 array, so even an empty one is written as a
# list of int64 (a Python list's element type is guessed, and an all-empty column has none), or
# None where a request had no prompt ids.
TOKEN_COLUMNS = ("prompt_token_ids", "output_token_ids")


def add_token_columns(frame: pd.DataFrame, outputs: Mapping[int, Sequence[int]],
                      prompts: Mapping[int, Sequence[int]]) -> None:
    """Add `output_token_ids` to a request table in place, by request_id (empty for a request
    that selected none), and `prompt_token_ids` when `prompts` has any (None for a request the
    workload gave no ids)."""
    ids = frame["request_id"].tolist()
    frame["output_token_ids"] = pd.Series([np.array(outputs.get(i, ()), dtype=np.int64) for i in ids],
                                          index=frame.index, dtype=object)
    if prompts:
        frame["prompt_token_ids"] = pd.Series(
            [None if prompts.get(i) is None else np.array(prompts[i], dtype=np.int64) for i in ids],
            index=frame.index, dtype=object)


def token_columns_as_text(frame: pd.DataFrame) -> pd.DataFrame:
    """The table with its token columns as JSON text (for CSV, which has no list cells; trace
    readers read list cells in CSV the same way). A frame without them is returned as is."""
    present = [c for c in TOKEN_COLUMNS if c in frame.columns]
    if not present:
        return frame
    out = frame.copy(deep=False)
    for column in present:
        out[column] = [None if ids is None else json.dumps(np.asarray(ids).tolist()) for ids in frame[column]]
    return out


def _stats(prefix: str, values_s: np.ndarray, out: dict, weights: np.ndarray | None = None) -> None:
    with np.errstate(over="ignore"):  # seconds past the float range in ms are inf, as they read
        ms = np.asarray(values_s, dtype=float) * 1000.0
    keep = ~np.isnan(ms)
    if not keep.all():
        ms = ms[keep]
        if weights is not None:
            weights = weights[keep]
    if weights is not None:
        if ms.size:
            stats = weighted_stats(ms, weights, PERCENTILES)
            for key, value in stats.items():
                out[f"{key}_{prefix}_ms"] = value
            return
    if ms.size == 0:
        out[f"mean_{prefix}_ms"] = None
        out[f"median_{prefix}_ms"] = None
        out[f"std_{prefix}_ms"] = None
        for p in PERCENTILES:
            out[f"p{p}_{prefix}_ms"] = None
        return
    mean, std = mean_and_std(ms)
    out[f"mean_{prefix}_ms"] = mean
    out[f"median_{prefix}_ms"] = float(np.median(ms))
    out[f"std_{prefix}_ms"] = std
    for p in PERCENTILES:
        out[f"p{p}_{prefix}_ms"] = float(np.percentile(ms, p))


def summarize(
    requests: Sequence[Request],
    *,
    itl: ItlLog | None = None,
    slo_ms: dict[str, float] | None = None,
    extra: dict | None = None,
) -> dict:
    """Summary in vLLM `bench serve` names (plus p90/p95), over finished requests."""
    return summarize_frame(request_frame(requests), itl=itl, slo_ms=slo_ms, extra=extra)


def summarize_frame(
    frame: pd.DataFrame,
    *,
    itl: ItlLog | None = None,
    slo_ms: dict[str, float] | None = None,
    extra: dict | None = None,
) -> dict:
    """`summarize` from a request table (as written to requests.parquet)."""
    status = frame["status"].to_numpy()
    finished = status == "finished"
    num_done = int(finished.sum())

    def done(name: str) -> np.ndarray:
        # One column of the finished rows (not a copy of the whole table: runs can be millions long).
        return frame[name].to_numpy()[finished]

    out: dict = {}
    if num_done:
        start = float(frame["arrival_s"].min())
        end = float(done("finish_s").max())
        duration = end - start
    else:
        duration = 0.0
    num_in = int(done("prompt_len").sum())
    num_out = int(done("num_outputs").sum())
    out["duration"] = duration
    out["completed"] = num_done
    out["num_requests"] = int(len(frame))
    out["num_rejected"] = int((status == "rejected").sum())
    # Of those, the ones rejected as they arrived (longer than max_model_len or the whole cache):
    # the configuration's doing, whatever the load.
    out["num_rejected_on_arrival"] = int(((status == "rejected") & frame["first_scheduled_s"].isna()).sum())
    out["num_unfinished"] = int((status == "unfinished").sum())
    out["num_timed_out"] = int((status == "timed_out").sum())  # their clients gave up (clients.timeout_s)
    out["total_input_tokens"] = num_in
    out["total_output_tokens"] = num_out
    out["request_throughput"] = num_done / duration if duration > 0 else None
    out["output_throughput"] = num_out / duration if duration > 0 else None
    out["total_token_throughput"] = (num_in + num_out) / duration if duration > 0 else None
    latencies = {column: done(column) for column in SLO_COLUMNS.values()}
    _stats("ttft", latencies["ttft_s"], out)
    _stats("tpot", latencies["tpot_s"], out)
    if itl is not None:
        values, weights = itl.arrays()
        _stats("itl", values, out, weights)
        del values, weights
    else:
        _stats("itl", np.zeros(0), out)
    _stats("e2el", latencies["e2el_s"], out)
    for part in ("queue", "prefill", "delivery"):
        values = done(f"{part}_s").astype(float) * 1000.0
        out[f"mean_{part}_ms"] = float(np.mean(values)) if values.size else None
    queried = int(frame["num_prefix_query_tokens"].sum())
    hits = int(frame["num_prefix_hit_tokens"].sum())
    out["prefix_cache_queries"] = queried
    out["prefix_cache_hits"] = hits
    out["prefix_cache_hit_rate"] = hits / queried if queried else None
    out["num_preemptions"] = int(frame["num_preemptions"].sum())
    if slo_ms:
        out["request_goodput"] = goodput(latencies, slo_ms, duration)
    if extra:
        out.update(extra)
    return out


SLO_COLUMNS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2el_s"}


def measured_rows(frame: pd.DataFrame, warmup: int, cooldown: int) -> pd.DataFrame:
    """The requests a summary measures: all but the first `warmup` and the last `cooldown` sent
    (by arrival, then request id), in the table's order."""
    if not warmup and not cooldown:
        return frame
    order = np.lexsort((frame["request_id"].to_numpy(), frame["arrival_s"].to_numpy()))
    keep = np.zeros(len(frame), dtype=bool)
    keep[order[warmup:max(len(order) - cooldown, warmup)]] = True
    return frame[keep].reset_index(drop=True)


def goodput(done: Mapping[str, np.ndarray], slo_ms: dict[str, float], duration: float) -> float | None:
    """Requests per second that met every SLO (an undefined TPOT meets a TPOT SLO, as in vLLM).

    `done`: the finished requests' columns (a DataFrame or a dict of arrays)."""
    if duration <= 0:
        return None
    ok = np.ones(len(done[SLO_COLUMNS["ttft"]]), dtype=bool)
    for metric, limit_ms in slo_ms.items():
        values = np.asarray(done[SLO_COLUMNS[metric]], dtype=float) * 1000.0
        ok &= np.isnan(values) | (values <= limit_ms)
    return float(ok.sum()) / duration
