"""Simulated vs published: re-run each published serving measurement in benchmarks/published/figures.yaml.

Every figure there is a number read from a public source (TensorRT-LLM's performance overview,
LMDeploy's A100 benchmark, NVIDIA NIM's benchmarking page, vLLM's nightly Buildkite runs), with
the setup it was measured on. This script builds the same setup as a servesim experiment, with
the default presets and no calibration, runs it, reads the same metric and prints

    id, role, setup, metric, published, simulated, error %

then, per role (`fit`: figures the default efficiencies may be tuned on; `held_out`: figures
they must never be tuned on), the median and largest |error|, how many are within 15% and how
many are off by more than 50%. A setup the simulator cannot express (an unknown model or
hardware preset, an unsupported dtype, ...) is listed as "not expressible" with the reason, and
counted apart, never dropped.

    python benchmarks/published.py                      # every figure (about 6 minutes on one core)
    python benchmarks/published.py --role held_out      # one role
    python benchmarks/published.py --only ID [ID ...]   # some figures
    python benchmarks/published.py --quick              # the first few figures, few requests (CI smoke)
    python benchmarks/published.py --json out.json      # also write every row as JSON
    python benchmarks/published.py --cost step_overhead_s=0.002   # what a changed default would do

Request counts: an offline figure runs min(published count, --max-requests) requests (default
4000: enough for the batch to turn over a few times at the largest batch sizes); a closed-loop
figure runs `rounds` requests per client (4 or 10, see the source's entry). --quick caps both at
a few hundred. A source with `measurement: steady_state` (genai-perf's measurement windows) is
read without the first and last round of closed-loop requests (the experiment's
metrics.warmup_requests and cooldown_requests).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FIGURES = Path(__file__).resolve().parent / "published" / "figures.yaml"
ROLES = ("fit", "held_out")
SCENARIOS = ("offline", "closed_loop", "batch")
METRICS = {
    # metric -> (unit it is compared in, how it is read from a simulated summary)
    "output_throughput": ("tok/s", lambda s, f: s["output_throughput"]),
    "output_throughput_per_gpu": ("tok/s/gpu", lambda s, f: s["output_throughput"] / f["tensor_parallel"]),
    "mean_ttft": ("ms", lambda s, f: s["mean_ttft_ms"]),
    "mean_tpot": ("ms", lambda s, f: s["mean_tpot_ms"]),
    "batch_latency": ("ms", lambda s, f: s["duration"] * 1e3),
}
UNIT_SCALE = {("s", "ms"): 1e3, ("ms", "ms"): 1.0, ("tok/s", "tok/s"): 1.0, ("tok/s/gpu", "tok/s/gpu"): 1.0}
REQUIRED = ("id", "role", "source", "where", "model", "hardware", "tensor_parallel", "weight_dtype", "kv_dtype",
            "scenario", "input_len", "output_len", "metric", "unit", "value")
# Requests per closed-loop client when the source's entry gives no `rounds`.
DEFAULT_ROUNDS = {"lmdeploy-0.1-a100-fp16": 4}
CLOSED_LOOP_ROUNDS = 10
QUICK_FIGURES = 4
QUICK_REQUESTS = 300


def load(path: Path = FIGURES) -> dict:
    """The parsed data file, checked: every figure complete, ids unique, values positive, sources known."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    sources, figures = data.get("sources") or {}, data.get("figures") or []
    seen: set[str] = set()
    for fig in figures:
        missing = [k for k in REQUIRED if k not in fig]
        if missing:
            raise ValueError(f"figure {fig.get('id', '?')}: missing {missing}")
        if fig["id"] in seen:
            raise ValueError(f"duplicate figure id {fig['id']}")
        seen.add(fig["id"])
        if fig["role"] not in ROLES:
            raise ValueError(f"figure {fig['id']}: role {fig['role']!r} not in {ROLES}")
        if fig["source"] not in sources:
            raise ValueError(f"figure {fig['id']}: unknown source {fig['source']!r}")
        if sources[fig["source"]].get("role") != fig["role"]:
            raise ValueError(f"figure {fig['id']}: role differs from its source's (roles go by whole source)")
        if fig["scenario"] not in SCENARIOS:
            raise ValueError(f"figure {fig['id']}: scenario {fig['scenario']!r} not in {SCENARIOS}")
        if fig["metric"] not in METRICS:
            raise ValueError(f"figure {fig['id']}: metric {fig['metric']!r} not in {sorted(METRICS)}")
        if (fig["unit"], METRICS[fig["metric"]][0]) not in UNIT_SCALE:
            raise ValueError(f"figure {fig['id']}: unit {fig['unit']!r} does not fit metric {fig['metric']}")
        if not (isinstance(fig["value"], (int, float)) and fig["value"] > 0 and math.isfinite(fig["value"])):
            raise ValueError(f"figure {fig['id']}: value must be a positive number")
        if fig["scenario"] != "offline" and not fig.get("concurrency"):
            raise ValueError(f"figure {fig['id']}: a {fig['scenario']} figure needs a concurrency")
    return data


def published_value(fig: dict) -> float:
    """The figure's value in the unit the simulator's metric is read in."""
    return fig["value"] * UNIT_SCALE[(fig["unit"], METRICS[fig["metric"]][0])]


def experiment_for(fig: dict, source: dict, *, max_requests: int, quick: bool, cost: dict | None = None) -> dict:
    """A servesim experiment (as a mapping) reproducing the figure's setup with default presets."""
    settings = dict(source.get("engine_settings") or {})
    concurrency = fig.get("concurrency")
    max_seqs = settings.get("max_num_seqs", 256)
    if max_seqs == "batch":  # the source's batch size is the engine's, as in LMDeploy's static benchmark
        max_seqs = concurrency
    tokens = int(settings.get("max_num_batched_tokens", 8192))
    if fig["scenario"] == "offline":
        count = min(int(fig.get("num_requests") or 3000), max_requests)
    elif fig["scenario"] == "closed_loop":
        rounds = int(source.get("rounds") or DEFAULT_ROUNDS.get(fig["source"], CLOSED_LOOP_ROUNDS))
        count = min(concurrency * rounds, max(max_requests, concurrency))
    else:
        count = concurrency
    if quick:
        count = min(count, max(QUICK_REQUESTS, concurrency or 0))
    if settings.get("policy") == "static":
        # One static batch (TensorRT-LLM's gptSessionBenchmark): every request prefilled
        # together, then decoded together until the last finishes.
        policy = {"name": "static", "max_batch_size": int(concurrency or count)}
    elif settings.get("chunked_prefill", True) is False:
        # Prompts run whole, sharing the step with the running decodes (TensorRT-LLM in-flight
        # batching without chunked context, its default: a prompt waits until it fits the step's
        # token budget beside the decodes).
        policy = {"name": "continuous", "mixed": True, "max_num_seqs": int(max_seqs), "max_num_batched_tokens": tokens,
                  "admission": settings.get("admission", "optimistic")}
    else:
        # Prompts and decodes share a step, prompts cut into pieces of up to the step's token
        # budget (TensorRT-LLM in-flight batching with chunked context, vLLM v1, TurboMind).
        policy = {"name": "chunked_prefill", "max_num_seqs": int(max_seqs), "max_num_batched_tokens": tokens,
                  "chunk_size": tokens, "admission": settings.get("admission", "optimistic")}
    model = fig["model"]
    if "/" in model or model.endswith(".json"):
        model = str((FIGURES.parent / model).resolve())
    exp = {
        "name": "published",
        "seed": 0,
        "model": model,
        "hardware": fig["hardware"],
        "tensor_parallel": int(fig["tensor_parallel"]),
        "attention_data_parallel": bool(fig.get("attention_data_parallel", False)),
        "weight_dtype": fig["weight_dtype"],
        "kv_cache": {"dtype": fig["kv_dtype"], "block_size": 16,
                     "gpu_memory_utilization": float(settings.get("gpu_memory_utilization", 0.9))},
        "workload": {
            "num_requests": count,
            "arrivals": {"kind": "burst"},
            "prompt_len": {"kind": "fixed", "value": int(fig["input_len"])},
            "output_len": {"kind": "fixed", "value": int(fig["output_len"])},
        },
        # The engine's kernels as the source states them (engine_settings.cost_model), then --cost.
        "cost_model": {"name": "roofline", **(settings.get("cost_model") or {}), **(cost or {})},
        "policies": [policy],
        "output": {"plots": False},
    }
    if fig["scenario"] == "closed_loop":
        exp["clients"] = {"concurrency": int(concurrency), "think_time_s": 0.0}
        if source.get("measurement") == "steady_state" and count >= 3 * int(concurrency):
            # genai-perf's measurement window: without the first round of requests (every
            # client starts at once) and the last (the clients drain).
            exp["metrics"] = {"warmup_requests": int(concurrency), "cooldown_requests": int(concurrency)}
    return exp


def simulate(fig: dict, source: dict, *, max_requests: int, quick: bool, cost: dict | None = None) -> dict:
    """One row: the figure, the simulated value and its error, or why the setup cannot be expressed."""
    from experiments.config import parse_experiment
    from experiments.runner import run_experiment

    row = {"id": fig["id"], "role": fig["role"], "source": fig["source"], "setup": setup_text(fig),
           "metric": fig["metric"], "unit": METRICS[fig["metric"]][0], "published": published_value(fig)}
    if fig.get("parallelism"):
        # A layout with no key in an experiment (tensor parallelism and attention data parallelism
        # with expert parallelism have theirs).
        row["status"] = "not expressible"
        row["reason"] = f"parallelism {fig['parallelism']}: the simulator has no setting for it"
        return row
    exp_dict = experiment_for(fig, source, max_requests=max_requests, quick=quick, cost=cost)
    row["num_requests"] = exp_dict["workload"]["num_requests"]
    started = time.perf_counter()
    try:
        exp = parse_experiment(exp_dict, source=None)
        run = run_experiment(exp)
    except Exception as exc:  # noqa: BLE001 - any refusal of the setup is reported, never hidden
        row["status"] = "not expressible"
        row["reason"] = _one_line(exc)
        return row
    summary = run.runs[0].summary
    if not summary.get("completed"):
        row["status"] = "not expressible"
        row["reason"] = f"no request completed ({summary.get('num_rejected', 0)} rejected, end: {summary.get('end_reason')})"
        return row
    simulated = float(METRICS[fig["metric"]][1](summary, fig))
    row.update(status="ok", simulated=simulated, error_pct=100.0 * (simulated - row["published"]) / row["published"],
               seconds=time.perf_counter() - started)
    if summary.get("num_rejected"):
        row["note"] = f"{summary['num_rejected']} requests rejected"
    return row


def setup_text(fig: dict) -> str:
    model = Path(fig["model"]).parent.name if fig["model"].endswith(".json") else fig["model"]
    dtype = fig["weight_dtype"] if fig["weight_dtype"] == fig["kv_dtype"] else f"{fig['weight_dtype']}/kv-{fig['kv_dtype']}"
    load_text = {"offline": "offline", "closed_loop": f"c={fig.get('concurrency')}",
                 "batch": f"batch={fig.get('concurrency')}"}[fig["scenario"]]
    layout = "dep" if fig.get("attention_data_parallel") else "tp"
    return (f"{model} {fig['hardware']} {layout}{fig['tensor_parallel']} {dtype} "
            f"{fig['input_len']}/{fig['output_len']} {load_text}")


def _plain(value):  # noqa: ANN001, ANN202 - numpy scalars in a summary, for json.dumps
    return value.item() if hasattr(value, "item") else str(value)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:160]


def summarize(rows: list[dict]) -> dict:
    """Per role: how many figures, how many ran, median and max |error|, within 15%, over 50%."""
    out = {}
    for role in (*ROLES, "all"):
        mine = [r for r in rows if role == "all" or r["role"] == role]
        if not mine:
            continue
        errors = [abs(r["error_pct"]) for r in mine if r["status"] == "ok"]
        out[role] = {
            "figures": len(mine),
            "simulated": len(errors),
            "not_expressible": len(mine) - len(errors),
            "median_abs_error_pct": statistics.median(errors) if errors else None,
            "max_abs_error_pct": max(errors) if errors else None,
            "within_15_pct": sum(e <= 15 for e in errors),
            "over_50_pct": sum(e > 50 for e in errors),
        }
    return out


LATENCY_METRICS = ("mean_ttft", "mean_tpot", "batch_latency")


def breakdown(rows: list[dict], figures: dict[str, dict]) -> list[tuple[str, dict]]:
    """Median |error| per role within groups: latency vs throughput, weight dtype, TP, hardware."""
    keys = {
        "kind": lambda f: "latency" if f["metric"] in LATENCY_METRICS else "throughput",
        "weights": lambda f: f["weight_dtype"],
        "tp": lambda f: str(f["tensor_parallel"]),
        "hardware": lambda f: f["hardware"],
    }
    out = []
    for name, key in keys.items():
        for value in sorted({key(figures[r["id"]]) for r in rows}):
            cell = {}
            for role in ROLES:
                errors = [abs(r["error_pct"]) for r in rows
                          if r["role"] == role and r["status"] == "ok" and key(figures[r["id"]]) == value]
                cell[role] = (statistics.median(errors), len(errors)) if errors else None
            out.append((f"{name}={value}", cell))
    return out


def print_breakdown(groups: list[tuple[str, dict]], out=sys.stdout) -> None:  # noqa: ANN001
    print(file=out)
    print(f"{'group':<20} " + " ".join(f"{role + ' median (n)':>20}" for role in ROLES), file=out)
    for label, cell in groups:
        parts = ["-" if cell[role] is None else f"{cell[role][0]:.1f}% ({cell[role][1]})" for role in ROLES]
        print(f"{label:<20} " + " ".join(f"{p:>20}" for p in parts), file=out)


def _fmt(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.1f}"
    return f"{value:.2f}"


def print_table(rows: list[dict], out=sys.stdout) -> None:  # noqa: ANN001
    id_w = max([len("id"), *(len(r["id"]) for r in rows)])
    setup_w = max([len("setup"), *(len(r["setup"]) for r in rows)])
    head = (f"{'id':<{id_w}}  {'role':<8}  {'setup':<{setup_w}}  {'metric':<25}  {'published':>10}  "
            f"{'simulated':>10}  {'error':>8}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in rows:
        metric = f"{r['metric']} ({r['unit']})"
        if r["status"] == "ok":
            print(f"{r['id']:<{id_w}}  {r['role']:<8}  {r['setup']:<{setup_w}}  {metric:<25}  "
                  f"{_fmt(r['published']):>10}  {_fmt(r['simulated']):>10}  {r['error_pct']:>+7.1f}%", file=out)
        else:
            print(f"{r['id']:<{id_w}}  {r['role']:<8}  {r['setup']:<{setup_w}}  {metric:<25}  "
                  f"{_fmt(r['published']):>10}  not expressible: {r['reason']}", file=out)


def print_summary(summary: dict, out=sys.stdout) -> None:  # noqa: ANN001
    print(file=out)
    print(f"{'role':<9} {'figures':>7} {'simulated':>9} {'not expr.':>9} {'median |err|':>12} "
          f"{'max |err|':>10} {'<=15%':>6} {'>50%':>5}", file=out)
    for role, s in summary.items():
        med = "-" if s["median_abs_error_pct"] is None else f"{s['median_abs_error_pct']:.1f}%"
        mx = "-" if s["max_abs_error_pct"] is None else f"{s['max_abs_error_pct']:.1f}%"
        print(f"{role:<9} {s['figures']:>7} {s['simulated']:>9} {s['not_expressible']:>9} {med:>12} {mx:>10} "
              f"{s['within_15_pct']:>6} {s['over_50_pct']:>5}", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", choices=(*ROLES, "all"), default="all", help="which figures (default all)")
    parser.add_argument("--only", nargs="+", metavar="ID", help="only these figure ids")
    parser.add_argument("--quick", action="store_true",
                        help=f"the first {QUICK_FIGURES} selected figures, at most {QUICK_REQUESTS} requests each")
    parser.add_argument("--max-requests", type=int, default=4000, help="cap on an offline figure's requests")
    parser.add_argument("--json", metavar="OUT", help="write the rows and the summary as JSON")
    parser.add_argument("--cost", action="append", default=[], metavar="KEY=VALUE",
                        help="a roofline parameter for every run (e.g. step_overhead_s=0.002), to see what a "
                             "change to the defaults would do; the published comparison uses none")
    parser.add_argument("--figures", default=str(FIGURES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    data = load(Path(args.figures))
    figures = [f for f in data["figures"] if args.role == "all" or f["role"] == args.role]
    if args.only:
        unknown = sorted(set(args.only) - {f["id"] for f in data["figures"]})
        if unknown:
            parser.error(f"unknown figure ids: {', '.join(unknown)}")
        figures = [f for f in figures if f["id"] in set(args.only)]
    if args.quick:
        figures = figures[:QUICK_FIGURES]
    cost = {}
    for item in args.cost:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--cost expects KEY=VALUE, found {item!r}")
        cost[key.strip()] = yaml.safe_load(value)
    if cost:
        print(f"roofline parameters changed from the defaults: {cost}\n")
    rows = [simulate(f, data["sources"][f["source"]], max_requests=args.max_requests, quick=args.quick, cost=cost)
            for f in figures]
    print_table(rows)
    summary = summarize(rows)
    print_summary(summary)
    print_breakdown(breakdown(rows, {f["id"]: f for f in figures}))
    print("\nsources:")
    for key in dict.fromkeys(f["source"] for f in figures):
        source = data["sources"][key]
        print(f"  {key} ({source['role']}): {source['title']}\n    {source['url']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=2, default=_plain) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
