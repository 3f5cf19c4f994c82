"""NaN and infinity are never accepted where they mean nothing (issue 40).

float() reads 'nan' and 'inf', and NaN fails every comparison, so a check written `x <= 0`
lets it through. Was: `--slo ttft_p90_ms=nan` searched with an SLO nothing meets, `--tol nan`
never closed a bracket, and a trace's `time_window: [0, .nan]` kept no request.
"""

from __future__ import annotations

import copy
import math

import pytest
import yaml

from experiments.capacity_search import parse_slo, search
from experiments.cli import main
from experiments.config import CostModelConfig, Experiment, parse_experiment
from experiments.docs_gen import _reachable
from simcore.errors import ConfigError
from tests.helpers import SMALL_EXPERIMENT
from workloads.spec import parse_workload


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "0", "-5"])
def test_slo_flag_limits_are_finite_and_positive(raw):
    with pytest.raises(ConfigError, match=rf"--slo ttft_p90_ms: an SLO limit must be a finite, positive number "
                                          rf"of milliseconds, found '{raw}'"):
        parse_slo(f"ttft_p90_ms={raw}")


@pytest.mark.parametrize("flag", ["--low", "--high", "--tol"])
@pytest.mark.parametrize("raw", ["nan", "inf", "0", "-1", "x"])
def test_capacity_float_flags_are_finite_and_positive(tmp_path, capsys, flag, raw):
    source = tmp_path / "exp.yaml"
    source.write_text(yaml.safe_dump(SMALL_EXPERIMENT))
    with pytest.raises(SystemExit) as exit_info:
        main(["capacity", str(source), "--slo", "ttft_p90_ms=500", flag, raw, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2  # a usage error, no traceback
    assert f"argument {flag}: expected a finite number > 0, found '{raw}'" in capsys.readouterr().err


@pytest.mark.parametrize(("low", "high", "tol", "match"), [
    (1.0, 2.0, math.nan, "--tol must be a finite number > 0"),
    (1.0, math.inf, 0.1, "need 0 < --low < --high, both finite"),
])
def test_capacity_search_checks_its_bounds_when_called_directly(tmp_path, low, high, tol, match):
    with pytest.raises(ConfigError, match=match):
        search([], {"p90_ttft_ms": 500.0}, tmp_path, low=low, high=high, tol=tol, source=None)


def test_every_section_of_the_experiment_schema_rejects_nan_and_inf():
    """One switch per model (allow_inf_nan=False) covers every float key, present and future;
    cost_model's own keys are checked by the cost model's factory."""
    for model in _reachable(Experiment):
        if model is not CostModelConfig:
            assert model.model_config.get("allow_inf_nan") is False, model.__name__


@pytest.mark.parametrize("path", ["metrics.slo.ttft_ms", "metrics.slo.tpot_ms", "metrics.slo.e2el_ms",
                                  "metrics.delivery_ms", "limits.max_sim_time_s", "kv_cache.host_memory_gib",
                                  "workload.arrivals.rate"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_experiment_float_keys_reject_nan_and_inf(path, value):
    data = copy.deepcopy(SMALL_EXPERIMENT)
    node = data
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    with pytest.raises(ConfigError, match=rf"exp.yaml: {path}: not a finite number"):
        parse_experiment(data, source="exp.yaml")


def test_trace_time_window_end_may_be_inf_but_not_nan():
    trace = {"path": "t.csv", "format": "csv"}
    assert parse_workload({"trace": {**trace, "time_window": [0, math.inf]}}).trace.time_window == (0.0, math.inf)
    with pytest.raises(ConfigError, match=r"workload.trace.time_window: time_window end must be a time in seconds "
                                          r"or .inf \(no end\), found nan"):
        parse_workload({"trace": {**trace, "time_window": [0, math.nan]}})
