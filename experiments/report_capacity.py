"""The capacity search's table: the highest rate meeting the SLOs per (variant, policy)."""

from __future__ import annotations

from typing import Any

from experiments.table import format_table, title

STATUS_NOTES = {
    "ok": "",
    "at-high": "meets the SLOs even at --high; raise --high",
    "below-low": "misses the SLOs already at --low; lower --low",
    "error": "a probe failed to run (see its ERROR.json)",
}


def capacity_table(result: dict[str, Any], style: str = "text") -> str:
    """Rows of capacity.json: the highest passing rate and the first failing one, each with the
    SLO metrics measured there (a search that passed at --high has no failing rate; one that
    failed at --low has no passing rate, and its row shows what was measured at --low)."""
    slo = result["slo"]
    rows = []
    for s in result["series"]:
        rows.append({"label": s["label"], "variant": s["variant"], "probes": len(s["probes"]), "status": s["status"],
                     "max_rate": _rate_text(s["max_rate"], below=result["low"]),
                     "fail_rate": _rate_text(s["first_failing_rate"], above=result["high"]),
                     **_measured(s, s["max_rate"], "pass"), **_measured(s, s["first_failing_rate"], "fail")})
    columns = [("Policy", "label", "{}")]
    if any(s["variant"] for s in result["series"]):
        columns.append(("Variant", "variant", "{}"))
    what, unit = searched(result["param"])
    columns.append((f"Max {what} ({unit})", "max_rate", "{}"))
    columns += [(f"{slo_header(k)} <= {v:g}", f"pass {k}", "{:.1f}") for k, v in slo.items()]
    columns.append((f"Fails at ({unit})", "fail_rate", "{}"))
    columns += [(f"{slo_header(k)} there", f"fail {k}", "{:.1f}") for k in slo]
    columns += [("Probes", "probes", "{:d}"), ("Status", "status", "{}")]
    heading = (f"{result['name']}: highest {result['param']} meeting {_slo_text(slo)} "
               f"(searched {result['low']:g}..{result['high']:g}, tolerance {result['tol']:g})")
    notes = sorted({STATUS_NOTES[s["status"]] for s in result["series"] if STATUS_NOTES.get(s["status"])})
    table = format_table(rows, columns, style=style, keys=2 if columns[1][1] == "variant" else 1)
    return "\n".join([title(heading, style), table, *(f"# note: {n}" if style == "csv" else f"note: {n}" for n in notes)])


def slo_header(key: str) -> str:
    """'p90_ttft_ms' -> 'P90 TTFT (ms)', as the summary tables name it."""
    stat, metric, _ = key.split("_")
    return f"{'Median' if stat in ('median', 'p50') else stat.capitalize()} {metric.upper()} (ms)"


def searched(param: str) -> tuple[str, str]:
    """What a search varied and its unit, for headers: a rate, or closed-loop clients."""
    return ("concurrency", "clients") if param == "clients.concurrency" else ("rate", "req/s")


def _rate_text(rate: float | None, *, below: float | None = None, above: float | None = None) -> str:
    # No passing rate: every rate down to --low failed; no failing one: all up to --high passed.
    if rate is not None:
        return f"{rate:.4g}"
    if below is not None:
        return f"< {below:.4g}"
    return f"> {above:.4g}"


def _measured(series: dict[str, Any], rate: float | None, prefix: str) -> dict[str, Any]:
    """The SLO metrics of the probe at `rate`, keyed '<prefix> <metric>'."""
    probe = next((p for p in series["probes"] if rate is not None and p["rate"] == rate), {})
    return {f"{prefix} {k}": v for k, v in probe.items()}


def _slo_text(slo: dict[str, float]) -> str:
    return ", ".join(f"{k} <= {v:g}" for k, v in slo.items())
