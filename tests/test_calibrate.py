"""Roofline calibration: the vectorized roofline, the fit, the file, and `servesim calibrate`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from backends.base import CostContext
from backends.calibration import error_summary, fit_roofline, load_calibration, shape_terms, write_calibration
from backends.profiled import plan_shape, read_profile, step_kind
from backends.roofline import RooflineCostModel, make_roofline
from experiments.cli import main
from simcore.errors import ConfigError
from simcore.plan import ScheduledSeq, StepPlan
from simcore.presets import get_model

TABLE = Path(__file__).parent / "data" / "profiles" / "cpu-tiny-llama.csv"
LLAMA = get_model("llama-3.1-8b")


def ctx(source: Path | None = None, hardware: str = "h200") -> CostContext:
    return CostContext(model=LLAMA, hardware_name=hardware, source=source)


def random_plans(n: int, seed: int = 0) -> list[StepPlan]:
    rng = np.random.default_rng(seed)
    plans = []
    for i in range(n):
        seqs = []
        for j in range(int(rng.integers(0, 3))):
            q, c = int(rng.integers(2, 2048)), int(rng.choice([0, int(rng.integers(1, 8192))]))
            seqs.append(ScheduledSeq(100 * i + j, q, c, bool(rng.random() < 0.7), q + c + int(rng.integers(0, 64))))
        for j in range(int(rng.integers(0 if seqs else 1, 64))):
            c = int(rng.integers(1, 8192))
            seqs.append(ScheduledSeq(100 * i + 50 + j, 1, c, True, c))
        plans.append(StepPlan(i, tuple(seqs)))
    return plans


def rows_from(plans: list[StepPlan], model: RooflineCostModel) -> list[dict]:
    rows = []
    for plan in plans:
        shape = plan_shape(plan)
        rows.append({"kind": step_kind(shape), **shape, "time_s": model.step_time(plan)})
    return rows


@pytest.mark.parametrize("graphs", [{}, {"cuda_graph_batch_sizes": [1, 2, 4, 8, 16, 32, 48]}])
def test_vectorized_roofline_equals_step_time_on_profile_aggregates(graphs):
    # (With CUDA graphs, the decode-only steps of up to 48 sequences run padded GEMMs.)
    model = make_roofline({"mfu": 0.41, "mbu": 0.73, "step_overhead_s": 1e-3, "per_seq_overhead_s": 2e-5, **graphs},
                          ctx())
    plans = random_plans(200)
    rows = rows_from(plans, model)
    predicted = shape_terms(model, rows).predict(0.41, 0.73, 1e-3, 2e-5)
    expected = np.asarray([r["time_s"] for r in rows])
    np.testing.assert_allclose(predicted, expected, rtol=1e-12)


def test_fit_recovers_known_parameters():
    truth = {"mfu": 0.47, "mbu": 0.68, "step_overhead_s": 2.5e-3, "per_seq_overhead_s": 1.5e-5}
    rows = rows_from(random_plans(150, seed=1), make_roofline(truth, ctx()))
    start = make_roofline({}, ctx())
    result = fit_roofline(start, rows)
    for key, value in truth.items():
        assert result.params[key] == pytest.approx(value, rel=0.02), key
    assert result.after["all"]["median_abs_rel_error"] < 1e-3
    assert result.before["all"]["median_abs_rel_error"] > 0.05
    assert set(result.after) >= {"all", "decode"}
    # Fitting a subset keeps the others at the starting model's values.
    partial = fit_roofline(start, rows, fit=("step_overhead_s",))
    assert partial.params["mfu"] == start.mfu and partial.params["mbu"] == start.mbu
    with pytest.raises(ValueError, match="can fit"):
        fit_roofline(start, rows, fit=("bogus",))


def test_error_summary_by_kind():
    out = error_summary(np.array([1.1, 0.9, 2.0]), np.array([1.0, 1.0, 1.0]), np.array(["decode", "decode", "mixed"]))
    assert out["all"]["count"] == 3 and out["decode"]["median_abs_rel_error"] == pytest.approx(0.1)
    assert out["mixed"]["max_abs_rel_error"] == pytest.approx(1.0) and "prefill" not in out


def write(tmp_path: Path, doc: dict | str, name: str = "calib.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def test_calibration_file_is_found_next_to_the_experiment_and_params_beside_it_win(tmp_path):
    model = make_roofline({}, ctx())
    result = fit_roofline(model, rows_from(random_plans(60, 2), make_roofline({"mfu": 0.5}, ctx())))
    (tmp_path / "cal").mkdir()
    write_calibration(tmp_path / "cal" / "c.yaml", result, model=LLAMA.name, hardware="h200")
    source = tmp_path / "exp.yaml"
    calibrated = make_roofline({"calibration": "cal/c.yaml"}, ctx(source))
    assert calibrated.mfu == pytest.approx(result.params["mfu"])
    assert calibrated.step_overhead_s == pytest.approx(result.params["step_overhead_s"])
    overridden = make_roofline({"calibration": "cal/c.yaml", "mbu": 0.5}, ctx(source))
    assert overridden.mbu == 0.5 and overridden.mfu == calibrated.mfu
    assert load_calibration(tmp_path / "cal" / "c.yaml")["mfu"] == calibrated.mfu


@pytest.mark.parametrize(("content", "match"), [
    (None, "cannot read calibration file"),
    ("params: [1, 2", "not valid YAML"),
    ("- 1\n- 2\n", "must be a mapping"),
    ({"kind": "other", "params": {"mfu": 0.5}}, "not a roofline calibration"),
    ({"kind": "roofline-calibration", "params": {"mfu": 0.5}, "extra": 1}, "unknown key"),
    ({"kind": "roofline-calibration"}, "lacks its params"),
    ({"kind": "roofline-calibration", "params": {"mfux": 0.5}}, "unknown roofline parameter"),
    ({"kind": "roofline-calibration", "params": {"mfu": "fast"}}, "not a finite number"),
    ({"kind": "roofline-calibration", "params": {"mfu": 1.5}}, "mfu"),
    ({"kind": "roofline-calibration", "hardware": "a100-80gb", "params": {"mfu": 0.5}}, "fitted on hardware 'a100-80gb'"),
])
def test_bad_calibration_files_are_config_errors(tmp_path, content, match):
    path = tmp_path / "missing.yaml" if content is None else write(tmp_path, content)
    source = tmp_path / "exp.yaml"
    with pytest.raises(ConfigError, match=match) as err:
        make_roofline({"calibration": path.name}, ctx(source))
    assert "exp.yaml" in str(err.value)


def test_calibrate_command_prints_errors_and_writes_a_usable_file(tmp_path, capsys):
    out = tmp_path / "c.yaml"
    assert main(["calibrate", str(TABLE), "--model", "tiny-llama", "--hardware", "cpu", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "median |err| before" in text and "decode" in text and "prefill" in text
    doc = yaml.safe_load(out.read_text())
    assert doc["kind"] == "roofline-calibration" and doc["hardware"] == "cpu"
    assert doc["error_after"]["all"]["median_abs_rel_error"] < doc["error_before"]["all"]["median_abs_rel_error"]
    tiny = CostContext(model=get_model("tiny-llama"), hardware_name="cpu", kv_dtype_bytes=4, weight_dtype_bytes=4,
                       activation_dtype="fp32", source=tmp_path / "exp.yaml")
    model = make_roofline({"calibration": "c.yaml"}, tiny)
    rows = read_profile(TABLE).rows
    terms = shape_terms(model, rows)
    err = np.abs(terms.predict(model.mfu, model.mbu, model.step_overhead_s, model.per_seq_overhead_s)
                 / terms.time_s - 1)
    assert np.median(err) == pytest.approx(doc["error_after"]["all"]["median_abs_rel_error"], rel=1e-3)
    assert main(["calibrate", str(TABLE), "--model", "tiny-llama", "--hardware", "cpu", "--fit", "mfu,bogus"]) == 2
    assert main(["calibrate", str(TABLE), "--model", "llama-3.1-8b", "--hardware", "cpu", "--out", str(out)]) == 2
    assert "geometry" in capsys.readouterr().err



def test_a_poor_fit_is_reported_and_noted_in_the_file(tmp_path):
    from backends.calibration import POOR_FIT_MEDIAN_ERROR, CalibrationResult, poor_fit_warnings

    good = {"all": {"count": 10, "median_abs_rel_error": 0.05}, "decode": {"count": 5, "median_abs_rel_error": 0.04}}
    assert poor_fit_warnings(good) == []
    poor = dict(good, prefill={"count": 5, "median_abs_rel_error": 0.54})
    (warning,) = poor_fit_warnings(poor)
    assert "prefill steps" in warning and "54%" in warning and f"{POOR_FIT_MEDIAN_ERROR:.0%}" in warning
    result = CalibrationResult(params={"mfu": 0.5}, before=poor, after=poor, fitted=("mfu",), loss=1.0)
    path = tmp_path / "c.yaml"
    write_calibration(path, result, model="tiny-llama", hardware="cpu")
    assert "poor fit on prefill steps" in yaml.safe_load(path.read_text())["note"]
    assert load_calibration(path, hardware="cpu")["mfu"] == 0.5
