"""`servesim validate` on a CPU: the real engine against profiled and roofline, the whole loop.

These check the report's structure and that its numbers are finite, not their size (CPU timings
on a shared machine are noise-dominated; the GPU session checks the targets).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch")

from backends.base import CostContext  # noqa: E402
from backends.profiled import ProfiledCostModel, read_profile  # noqa: E402
from experiments.cli import main  # noqa: E402
from experiments.config import load_experiment  # noqa: E402
from experiments.fidelity import RecordingCostModel, resolve_setup, step_pairs  # noqa: E402
from simcore.errors import ConfigError  # noqa: E402
from simcore.plan import ScheduledSeq, StepPlan  # noqa: E402
from simcore.presets import get_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "experiments" / "examples" / "validate_tiny_cpu.yaml"
TABLE = ROOT / "tests" / "data" / "profiles" / "cpu-tiny-llama.csv"
LATENCY_STATS = ("mean", "p50", "p90", "p99")


def finite(value) -> bool:  # noqa: ANN001
    return isinstance(value, (int, float)) and math.isfinite(value)


def test_validate_example_writes_pairs_report_and_plots(tmp_path, capsys):
    calib = tmp_path / "calib.yaml"
    assert main(["calibrate", str(TABLE), "--model", "tiny-llama", "--hardware", "cpu", "--out", str(calib)]) == 0
    out = tmp_path / "val"
    code = main(["validate", str(EXAMPLE), "--device", "cpu", "--out", str(out), "--calibration", str(calib), "--quiet"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "end to end" in printed and "per step" in printed and "chunked_prefill" in printed

    report = json.loads((out / "fidelity.json").read_text())
    assert report["engine"]["device"] == "cpu" and report["engine"]["threads"] == 1  # as the table was measured
    assert set(report["policies"]) == {"continuous", "chunked_prefill"}
    steps = pd.read_parquet(out / "step_pairs.parquet")
    requests = pd.read_parquet(out / "request_pairs.parquet")
    for label, entry in report["policies"].items():
        assert set(entry["against"]) == {"profiled", "roofline"}
        measured_steps = pd.read_parquet(out / "measured" / label / "steps.parquet")
        assert entry["num_steps"] == len(measured_steps) > 0
        for name, comp in entry["against"].items():
            e2e = comp["end_to_end"]
            for metric in ("ttft", "tpot", "itl", "e2el"):
                for stat in LATENCY_STATS:
                    cell = e2e[metric][stat]
                    assert finite(cell["measured"]) and finite(cell["predicted"]) and finite(cell["rel_error"])
            assert finite(e2e["request_throughput"]["rel_error"])
            assert comp["steps"]["all"]["count"] == len(measured_steps)
            for kind in ("all", "decode", "prefill", "mixed", "not_in_profile"):
                stats = comp["steps"][kind]
                if stats["count"]:
                    assert all(finite(stats[k]) for k in ("median_abs_rel_error", "p90_abs_rel_error",
                                                          "max_abs_rel_error"))
            assert comp["requests"]["ttft"]["count"] == 12
            # Per-step pairs are the real run's steps, in order, with the measured durations.
            pairs = steps[(steps["policy"] == label) & (steps["against"] == name)]
            assert pairs["step_id"].tolist() == measured_steps["step_id"].tolist()
            assert pairs["measured_s"].tolist() == measured_steps["duration_s"].tolist()
            assert pairs["num_prefill_tokens"].tolist() == measured_steps["num_prefill_tokens"].tolist()
            assert pairs["num_decode_tokens"].tolist() == measured_steps["num_decode_tokens"].tolist()
            assert (pairs["predicted_s"] > 0).all()
            assert len(requests[(requests["policy"] == label) & (requests["against"] == name)]) == 12
    kinds = set(steps.loc[steps["policy"] == "chunked_prefill", "kind"])
    assert {"decode", "mixed"} <= kinds
    assert requests[["ttft_measured_s", "ttft_predicted_s", "e2el_rel_error"]].notna().all().all()
    for key, rel in report["files"].items():
        assert (out / rel).exists() and (out / rel).stat().st_size > 0, key
    assert {"step_scatter:continuous", "latency_cdf:chunked_prefill"} <= set(report["files"])
    for folder in ("measured", "predicted-profiled", "predicted-roofline"):
        assert (out / folder / "summary.json").exists()
    assert "name: torch" in (out / "measured" / "resolved.yaml").read_text()


def test_step_pairs_price_the_recorded_plans():
    class Fake:
        last_step_extras = {"gpu_time_s": 0.5}

        def step_time(self, plan):
            return 1.0 + plan.num_batched_tokens

    plans = [StepPlan(0, (ScheduledSeq(1, 30, 0, True, 30, (0, 1)),)),
             StepPlan(1, (ScheduledSeq(1, 1, 30, True, 30, (0, 1)), ScheduledSeq(2, 8, 16, False, 40, (2, 3))))]
    recorder = RecordingCostModel(Fake())
    assert [recorder.step_time(p) for p in plans] == [31.0, 10.0]
    assert recorder.gpu_time == [0.5, 0.5] and recorder.last_step_extras == {"gpu_time_s": 0.5}
    assert all(s.block_table == () for p in recorder.plans for s in p.seqs)
    table = read_profile(TABLE)
    model = ProfiledCostModel.from_table(table)
    frame = step_pairs("p", "profiled", model, recorder.plans, recorder.measured, recorder.gpu_time, set())
    assert frame["predicted_s"].tolist() == [model.step_time(p) for p in plans]
    assert frame["kind"].tolist() == ["prefill", "mixed"]
    assert frame["num_prefill_pieces"].tolist() == [1, 1]
    recorder.release()
    assert recorder.inner is None


def test_setup_takes_engine_options_from_the_table_and_checks_choices(tmp_path):
    exp = load_experiment(EXAMPLE)
    setup = resolve_setup(exp, source=EXAMPLE, device="cpu")
    header = read_profile(TABLE).header
    assert setup.torch_params["dtype"] == header["dtype"] and setup.torch_params["_threads"] == 1
    assert list(setup.against) == ["profiled", "roofline"]
    assert resolve_setup(exp, source=EXAMPLE, device="cpu", against=["roofline"]).against == {"roofline": {}}
    with pytest.raises(ConfigError, match="unknown model to validate against"):
        resolve_setup(exp, source=EXAMPLE, against=["vidur"])
    plain = load_experiment(EXAMPLE, ["cost_model={name: roofline}"])
    with pytest.raises(ConfigError, match="needs a table"):
        resolve_setup(plain, source=EXAMPLE, against=["profiled"])
    assert list(resolve_setup(plain, source=EXAMPLE).against) == ["roofline"]


def test_a_bad_calibration_fails_before_the_real_run(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: roofline-calibration\nparams: {mfu: 2.0}\n")
    code = main(["validate", str(EXAMPLE), "--device", "cpu", "--out", str(tmp_path / "o"), "--calibration", str(bad),
                 "--quiet"])
    assert code == 2
    assert "mfu" in capsys.readouterr().err
    assert not (tmp_path / "o" / "measured").exists()


def test_cost_context_matches_the_runner():
    from experiments.fidelity import cost_context

    exp = load_experiment(EXAMPLE)
    got = cost_context(exp, EXAMPLE)
    assert isinstance(got, CostContext) and got.model == get_model("tiny-llama")
    assert got.num_blocks == 128 and got.kv_dtype_bytes == 4 and got.source == EXAMPLE


H200 = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h200-2026-12-04"


def test_profiled_fit_holds_the_eager_prefill_floor_of_the_h200_table():
    # On the first H200 run every prompt-bearing step (eager) cost at least ~32 ms, 16 or 1024 tokens
    # alike, and decode steps (CUDA graphs) 8 ms. Without a term for the eager path the fit priced
    # fresh prompts of up to 1024 tokens 27-49% low.
    import numpy as np

    from backends.profiled import StepTimeFit

    rows = read_profile(H200 / "profile.csv").rows
    fit = StepTimeFit.fit(rows)
    assert fit.terms()["prefill_path_s"] > 0.015
    err = np.abs(fit.predict(rows) / np.array([r["time_s"] for r in rows]) - 1)
    prefill = np.array([r["kind"] == "prefill" for r in rows])
    assert np.median(err[prefill]) < 0.05 and err[prefill].max() < 0.15
    assert np.median(err[~prefill]) < 0.1


def test_h200_results_stay_small_and_the_readme_names_the_run():
    sizes = {str(p): p.stat().st_size for p in H200.rglob("*") if p.is_file()}
    assert sum(sizes.values()) < 1_000_000
    assert all(size < 200_000 for name, size in sizes.items() if name.endswith(".parquet"))
    readme = (H200 / "README.md").read_text()
    assert "b036084" in readme and "gpu_check.py" in readme


def test_step_stats_say_where_the_time_is():
    from experiments.fidelity import format_report, step_error_stats

    # 9 short decode steps priced right, one long prefill priced at a third: the median hides it.
    frame = pd.DataFrame({"kind": ["decode"] * 9 + ["prefill"], "in_profile": [False] * 10,
                          "measured_s": [0.01] * 9 + [0.09], "predicted_s": [0.01] * 9 + [0.03]})
    frame["rel_error"] = (frame["predicted_s"] - frame["measured_s"]) / frame["measured_s"]
    stats = step_error_stats(frame)
    assert stats["all"]["median_abs_rel_error"] == 0
    assert stats["prompt"]["time_share"] == pytest.approx(0.5)
    assert stats["prompt"]["time_rel_error"] == pytest.approx(-2 / 3)
    assert stats["decode"]["time_share"] == pytest.approx(0.5) and stats["decode"]["time_rel_error"] == 0
    assert stats["total_time"]["rel_error"] == pytest.approx(-1 / 3)
    empty = {"measured": 1.0, "predicted": 1.0, "rel_error": 0.0}
    e2e = {m: {s: empty for s in ("mean", "p50", "p90", "p99")} for m in ("ttft", "tpot", "itl", "e2el")}
    report = {"policies": {"continuous": {"against": {"profiled": {
        "end_to_end": {**e2e, "request_throughput": empty}, "steps": stats}}}}}
    assert "50.0% (-66.7%)" in format_report(report)
