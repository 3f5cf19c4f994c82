"""The tables of this folder's README, from step_pairs.parquet (every step the H200 validate runs executed).

    python benchmarks/results/h200-2026-12-04/first_shapes.py

1. Steps by kind: measured against the profiled table's prediction (median ms).
2. Prompt-bearing steps by whether the run (one process per load: continuous, then chunked prefill) had
   already executed a step with the same number of prompt tokens: a repeat is 2-3x faster.
3. Where the run's time went: the share of prompt-bearing steps in the measured time, and how much of the
   total-time error they carry.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent


def with_first_seen(steps: pd.DataFrame) -> pd.DataFrame:
    """Mark each prompt-bearing step whose prompt-token count the load's process had executed before."""
    out = []
    for _, part in steps.groupby("load", observed=True, sort=False):
        seen: set[int] = set()
        flags = []
        for tokens in part["num_prefill_tokens"].tolist():
            flags.append(tokens in seen)
            if tokens:
                seen.add(tokens)
        out.append(part.assign(repeat_shape=flags))
    return pd.concat(out)


def main() -> None:
    steps = with_first_seen(pd.read_parquet(HERE / "step_pairs.parquet"))
    pd.set_option("display.width", 160)
    pd.set_option("display.max_columns", 20)
    pd.set_option("display.float_format", "{:.1f}".format)
    ms = steps.assign(measured_ms=steps["measured_s"] * 1e3, profiled_ms=steps["predicted_profiled_s"] * 1e3)
    by_kind = ms.groupby(["load", "policy", "kind"], observed=True).agg(
        steps=("measured_ms", "size"), measured_ms=("measured_ms", "median"), profiled_ms=("profiled_ms", "median"),
        prompt_tokens=("num_prefill_tokens", "median"))
    print("1. steps by kind (medians)\n", by_kind.round(1), "\n")
    prompt = ms[ms["kind"] != "decode"]
    by_repeat = prompt.groupby(["load", "policy", "repeat_shape"], observed=True).agg(
        steps=("measured_ms", "size"), measured_ms=("measured_ms", "median"), profiled_ms=("profiled_ms", "median"))
    print("2. prompt-bearing steps: first time a prompt-token count is met vs a repeat (medians)\n",
          by_repeat.round(1), "\n")
    rows = []
    for (load, policy), part in steps.groupby(["load", "policy"], observed=True):
        total = part["measured_s"].sum()
        nd = part[part["kind"] != "decode"]
        rows.append({"load": load, "policy": policy, "measured_s": round(total, 2),
                     "prompt_steps_share_of_time": round(nd["measured_s"].sum() / total, 3),
                     "their_error_of_total": round((nd["predicted_profiled_s"].sum() - nd["measured_s"].sum()) / total, 3),
                     "decode_error_of_total": round((part.loc[part["kind"] == "decode", "predicted_profiled_s"].sum()
                                                     - part.loc[part["kind"] == "decode", "measured_s"].sum()) / total, 3)})
    print("3. where the time and the total-time error are\n", pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
