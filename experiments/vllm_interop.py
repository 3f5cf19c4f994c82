"""vLLM `bench serve` result JSON: write simulated results in its layout, and read real ones back.

The layout is what `vllm bench serve --save-result --save-detailed` writes: run settings (date,
backend, model_id, num_prompts, request_rate, burstiness, max_concurrency), totals and
throughputs, per-request lists (input_lens, output_lens, ttfts and itls in seconds, errors), and
mean/median/std/pNN of ttft, tpot, itl and e2el in ms. generated_texts is left out: a simulator
has no text. Our summary already uses these metric names, so the statistics copy over as they are.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simcore.errors import ConfigError

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
STAT_RE = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
TOTAL_KEYS = ("duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
              "request_goodput", "output_throughput", "total_token_throughput")
THROUGHPUT_KEYS = ("request_throughput", "output_throughput", "total_token_throughput")


def result_date() -> str:
    """vLLM's date stamp; SOURCE_DATE_EPOCH (the reproducible-builds convention) pins it for byte-stable files."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = dt.datetime.fromtimestamp(int(epoch), dt.timezone.utc) if epoch else dt.datetime.now()
    return when.strftime("%Y%m%d-%H%M%S")


def to_vllm(summary: dict[str, Any], requests: pd.DataFrame, steps: pd.DataFrame, resolved: dict[str, Any],
            *, date: str | None = None) -> dict[str, Any]:
    """One policy's results as a vLLM result dict (per-request lists in request-id order)."""
    workload = resolved.get("workload") or {}
    rate, burstiness = _traffic(workload, requests)
    model = str(resolved.get("model", "?"))
    out: dict[str, Any] = {
        "date": date or result_date(),
        "endpoint_type": "servesim",
        "backend": "servesim",
        "label": summary.get("label"),
        "model_id": model,
        "tokenizer_id": model,
        "num_prompts": int(summary.get("num_requests", len(requests))),
        "request_rate": rate,
        "burstiness": burstiness,
        "max_concurrency": None,
    }
    out.update({k: summary[k] for k in TOTAL_KEYS if k in summary})
    out["failed"] = int(summary.get("num_requests", 0)) - int(summary.get("completed", 0))
    out.update(_per_request(requests))
    for key, value in summary.items():
        if STAT_RE.match(key):
            out[key] = value
    out["max_output_tokens_per_s"] = _peak_output_rate(steps)
    out["max_concurrent_requests"] = int(steps["num_running"].max()) if len(steps) else 0
    # Where the numbers came from, for a reader who finds this file without its results folder.
    out["servesim"] = {
        "experiment": resolved.get("name"), "policy": summary.get("policy"), "hardware": resolved.get("hardware"),
        "cost_model": (resolved.get("cost_model") or {}).get("name"),
        "itls_exact": "output_times_s" in requests,
    }
    return out


def _traffic(workload: dict[str, Any], requests: pd.DataFrame) -> tuple[Any, Any]:
    """request_rate and burstiness as vLLM states them (gamma shape = 1/cv^2; Poisson = 1)."""
    arrivals = workload.get("arrivals") or {}
    kind = arrivals.get("kind")
    if kind == "poisson":
        return arrivals["rate"], 1.0
    if kind == "gamma":
        return arrivals["rate"], 1.0 / arrivals["cv"] ** 2
    if kind == "constant":
        return arrivals["rate"], None
    if kind == "burst":
        return "inf", None
    # A trace: its observed mean rate.
    times = np.sort(requests["arrival_s"].to_numpy(float))
    span = times[-1] - times[0] if times.size > 1 else 0.0
    return (float((times.size - 1) / span) if span > 0 else "inf"), None


def _per_request(requests: pd.DataFrame) -> dict[str, list]:
    """input_lens, output_lens, ttfts, itls, errors: vLLM counts a request that did not finish as failed
    (ttft 0, no itls, output 0) and says why in `errors`."""
    frame = requests.sort_values("request_id", kind="stable")
    out: dict[str, list] = {"input_lens": [], "output_lens": [], "ttfts": [], "itls": [], "errors": []}
    for row in frame.to_dict(orient="records"):
        done = row["status"] == "finished"
        out["input_lens"].append(int(row["prompt_len"]))
        out["output_lens"].append(int(row["num_outputs"]) if done else 0)
        out["ttfts"].append(float(row["ttft_s"]) if done else 0.0)
        out["itls"].append(_itls(row) if done else [])
        out["errors"].append("" if done else f"{row['status']}: {row.get('reject_reason') or 'not finished'}")
    return out


def _itls(row: dict[str, Any]) -> list[float]:
    times = row.get("output_times_s")
    if times is not None:
        return [float(x) for x in np.diff(np.asarray(times, dtype=float))]
    # Without per-token times, every gap is the request's mean (TPOT); the summary ITL stats stay exact.
    n = int(row["num_outputs"])
    tpot = row.get("tpot_s")
    return [] if n < 2 or tpot is None or math.isnan(tpot) else [float(tpot)] * (n - 1)


def _peak_output_rate(steps: pd.DataFrame) -> float:
    """Most output tokens selected in any one-second window of simulated time (vLLM's per-second peak)."""
    if not len(steps):
        return 0.0
    end = (steps["start_s"] + steps["duration_s"]).to_numpy(float)
    tokens = steps["num_selected"].to_numpy(float)
    seconds = np.floor(end).astype(np.int64)
    return float(np.bincount(seconds - seconds.min(), weights=tokens).max())


def read_vllm(path: str | Path) -> dict[str, Any]:
    """A vLLM result JSON (or a file from `servesim export --vllm`)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("vLLM result file not found", source=str(path)) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc.msg}", source=str(path), where=f"line {exc.lineno}") from None
    if not isinstance(data, dict) or not any(STAT_RE.match(k) for k in data):
        raise ConfigError("not a vLLM bench serve result: no metric keys such as mean_ttft_ms", source=str(path))
    return data


def compare_rows(real: dict[str, Any], sim: dict[str, Any]) -> list[dict[str, Any]]:
    """Metric by metric: real, simulated and relative error (sim - real) / real, for keys both have."""
    keys = [k for k in real if STAT_RE.match(k) and not k.startswith("std_")]
    keys.sort(key=lambda k: (LATENCY_METRICS.index(STAT_RE.match(k).group(2)), stat_order(STAT_RE.match(k).group(1))))
    keys += [k for k in (*THROUGHPUT_KEYS, "duration", "completed") if k in real]
    rows = []
    for key in keys:
        r, s = real.get(key), sim.get(key)
        if not isinstance(r, (int, float)) or not isinstance(s, (int, float)):
            continue
        rel = (s - r) / r if r else None
        rows.append({"metric": key, "real": float(r), "sim": float(s), "rel_err": rel})
    return rows


def stat_order(stat: str) -> float:
    """mean, median, then percentiles in increasing order."""
    return {"mean": -2.0, "median": -1.0}.get(stat, float(stat[1:]) if stat.startswith("p") else 1000.0)


def workload_notes(real: dict[str, Any], sim: dict[str, Any]) -> list[str]:
    """Warnings when the two runs did not see the same workload (then the comparison means little)."""
    notes = []
    for key in ("num_prompts", "total_input_tokens", "request_rate"):
        if key in real and key in sim and real[key] != sim[key]:
            notes.append(f"{key} differs: real {real[key]}, simulated {sim[key]}")
    return notes
