"""The capacity search's table: the highest rate meeting the SLOs per (variant, policy)."""

from __future__ import annotations

from typing import Any

from experiments.table import format_table

STATUS_NOTES = {
    "ok": "",
    "at-high": "meets the SLOs even at --high; raise --high",
    "below-low": "misses the SLOs already at --low; lower --low",
    "error": "a probe failed to run (see its ERROR.json)",
}


def capacity_table(result: dict[str, Any]) -> str:
    """Rows of capacity.json: max passing rate, first failing rate, and the SLO metrics at the max."""
    slo = result["slo"]
    rows = []
    for s in result["series"]:
        best = next((p for p in s["probes"] if p["rate"] == s["max_rate"]), {})
        row = {"label": s["label"], "variant": s["variant"], "max_rate": s["max_rate"],
               "fail_rate": s["first_failing_rate"], "probes": len(s["probes"]), "status": s["status"]}
        row.update({k: best.get(k) for k in slo})
        rows.append(row)
    columns = [("policy", "label", "{}")]
    if any(s["variant"] for s in result["series"]):
        columns.append(("variant", "variant", "{}"))
    columns += [("max req/s", "max_rate", "{:.4g}"), ("fails at", "fail_rate", "{:.4g}"), ("probes", "probes", "{:d}")]
    columns += [(f"{k} (<= {v:g})", k, "{:.1f}") for k, v in slo.items()]
    columns.append(("status", "status", "{}"))
    lines = [f"{result['name']}: highest {result['param']} meeting {_slo_text(slo)} "
             f"(searched {result['low']:g}..{result['high']:g}, tolerance {result['tol']:g})",
             format_table(rows, columns)]
    notes = sorted({STATUS_NOTES[s["status"]] for s in result["series"] if STATUS_NOTES.get(s["status"])})
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def _slo_text(slo: dict[str, float]) -> str:
    return ", ".join(f"{k} <= {v:g}" for k, v in slo.items())
