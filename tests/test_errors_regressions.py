"""Reproducers for bugs found by fuzzing and probing bad input (tests/test_fuzz_*.py).

Every one is fixed and must pass.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

from backends.constant import ConstantCostModel
from experiments.config import parse_experiment
from experiments.runner import resolve_kv, run_experiment
from policies.accelerate import accelerator_for
from policies.registry import make_policy
from simcore.cluster import simulate
from simcore.errors import ConfigError, ServesimError
from simcore.hf_config import model_from_hf_dict
from simcore.validate import build_model_from_params, load_yaml_mapping, parse_yaml
from tests.helpers import SMALL_EXPERIMENT, req
from workloads.spec import build_requests, parse_workload

BASE = {**SMALL_EXPERIMENT}


def with_changes(**changes) -> dict:  # noqa: ANN003
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        node = data
        *parents, last = path.split(".")
        for key in parents:
            node = node[key]
        node[last] = value
    return data


def run(data: dict):  # noqa: ANN201
    return run_experiment(parse_experiment(data, source="exp.yaml"), source=None)


# --- fixed --------------------------------------------------------------------------------------


def _csv_trace_fails(folder: Path, text: str, match: str) -> None:
    """A generic CSV trace with these rows is a ConfigError whose message matches."""
    (folder / "t.csv").write_text(text)
    spec = parse_workload({"trace": {"path": "t.csv", "format": "csv"}})
    with pytest.raises(ConfigError, match=match):
        build_requests(spec, seed=0, base_dir=folder)


@pytest.mark.parametrize("cell", ["1e30", "99999999999999999999999", "9.3e18"])
def test_huge_trace_token_counts_are_a_config_error(tmp_path, cell):
    """Was: int64 overflow to a negative prompt_len, then a ValueError traceback from Request."""
    _csv_trace_fails(tmp_path, f"arrival_s,prompt_len,output_len\n0,10,5\n1,{cell},5\n",
                     r"t.csv: row 2, column 'prompt_len': bad token count; expected at most")


@pytest.mark.parametrize("cell", ["", "inf", "nan"])
def test_a_missing_prefix_length_is_a_config_error(tmp_path, cell):
    """Was: `int(nan)` raised a ValueError traceback (found by tests/test_fuzz_traces.py)."""
    _csv_trace_fails(tmp_path, f"arrival_s,prompt_len,output_len,prefix_len,prefix_key\n0,4,1,{cell},sys\n",
                     r"t.csv: row 1, column 'prefix_len': bad prefix length; expected a whole")


@pytest.mark.parametrize(("name", "fmt"), [("t.jsonl", "jsonl"), ("m.jsonl", "mooncake"), ("s.json", "sharegpt")])
def test_non_utf8_json_traces_are_a_config_error(tmp_path, name, fmt):
    """Was: UnicodeDecodeError traceback."""
    (tmp_path / name).write_bytes(b'{"arrival_s": 0}\n\xff\xfe\n')
    data = {"trace": {"path": name, "format": fmt}}
    if fmt == "sharegpt":
        data["arrivals"] = {"kind": "poisson", "rate": 1.0}
    with pytest.raises(ConfigError, match=rf"{name}.*UTF-8"):
        build_requests(parse_workload(data), seed=0, base_dir=tmp_path)


def test_resampling_an_empty_trace_is_a_config_error(tmp_path):
    """Was: numpy ValueError from rng.choice(0, n, replace=True)."""
    (tmp_path / "t.csv").write_text("arrival_s,prompt_len,output_len\n")
    spec = parse_workload({"trace": {"path": "t.csv", "format": "csv", "sample": {"n": 3, "replace": True}}})
    with pytest.raises(ConfigError, match="the trace gives no requests"):
        build_requests(spec, seed=0, base_dir=tmp_path)


def test_header_only_trace_is_an_error_not_an_empty_run(tmp_path):
    """Was: a run of 0 requests with a summary full of blanks."""
    (tmp_path / "t.csv").write_text("arrival_s,prompt_len,output_len\n")
    with pytest.raises(ConfigError, match=r"workload.trace.path: the trace gives no requests"):
        build_requests(parse_workload({"trace": {"path": "t.csv", "format": "csv"}}), seed=0, base_dir=tmp_path)


@pytest.mark.parametrize(
    ("field", "value"),
    [("arrivals", {"kind": "poisson", "rate": math.inf}), ("prompt_len", {"kind": "lognormal", "median": 5,
                                                                          "sigma": math.inf}),
     ("prompt_len", {"kind": "fixed", "value": 2**63}), ("output_len", {"kind": "uniform", "low": 1, "high": 2**70}),
     ("prompt_len", {"kind": "empirical", "values": [10**20]}), ("num_requests", 10**20)],
)
def test_non_finite_and_huge_workload_numbers_are_rejected(field, value):
    """Was: all arrivals at t=0 (rate inf), NaN lengths or int64 overflow (tracebacks)."""
    with pytest.raises(ConfigError, match=rf"exp.yaml: workload.{field}"):
        parse_experiment(with_changes(**{f"workload.{field}": value}), source="exp.yaml")


def test_lognormal_without_max_stays_in_range():
    """Huge draws are clipped to the largest token count instead of wrapping to negative int64."""
    spec = parse_workload({"num_requests": 50, "arrivals": {"kind": "burst"},
                           "prompt_len": {"kind": "lognormal", "median": 1e300, "sigma": 300},
                           "output_len": {"kind": "fixed", "value": 1}})
    requests = build_requests(spec, seed=0, base_dir=Path("."))
    assert all(1 <= r.prompt_len <= 2**31 - 1 for r in requests)


def test_host_memory_past_the_float_range_is_a_config_error():
    """Was: `host_memory_gib: 1e300` times a GiB overflowed to inf, and inf // block bytes is
    nan ('cannot convert float NaN to integer', a traceback; found by the config fuzzer)."""
    exp = parse_experiment(with_changes(**{"kv_cache.host_memory_gib": 1e300}), source="exp.yaml")
    with pytest.raises(ConfigError, match=r"exp.yaml: kv_cache.host_memory_gib: 1e\+300 GiB holds more KV blocks"):
        resolve_kv(exp, source="exp.yaml")
    # Large but within range: the block-count limit's own message.
    exp = parse_experiment(with_changes(**{"kv_cache.host_memory_gib": 1e12}), source="exp.yaml")
    with pytest.raises(ConfigError, match=r"kv_cache.host_memory_gib: .* KV blocks is more than servesim tracks"):
        resolve_kv(exp, source="exp.yaml")


@pytest.mark.parametrize(("field", "value", "match"), [
    ("model", "~0", r"model: unknown model.*found '~0'"),
    ("model", "~no-such-user-0/config.json", r"no-such-user-0"),
    ("workload.trace", {"path": "~no-such-user-0/t.csv", "format": "csv"},
     r"workload.trace.path: trace file not found.*no-such-user-0"),
])
def test_a_path_under_an_unknown_users_home_is_a_config_error(field, value, match):
    """Was: `Path.expanduser` raised RuntimeError('Could not determine home directory.') for
    ~user of no such user (a traceback; found by the config fuzzer with `model: ~0`)."""
    changes = {field: value}
    if field == "workload.trace":
        changes = {"workload": {"trace": value, "num_requests": 3}}
    with pytest.raises(ConfigError, match=match):
        run(with_changes(**changes))


def test_a_normal_length_with_std_minus_zero_is_a_point_mass():
    """Was: `std: -0.0` passed `std >= 0`, then numpy refused the scale ('scale < 0', a traceback;
    found by the config fuzzer)."""
    spec = parse_workload({"num_requests": 5, "arrivals": {"kind": "burst"},
                           "prompt_len": {"kind": "normal", "mean": 40.4, "std": -0.0, "max": 100},
                           "output_len": {"kind": "fixed", "value": 1}})
    assert [r.prompt_len for r in build_requests(spec, seed=0, base_dir=Path("."))] == [40] * 5


@pytest.mark.parametrize(
    ("params", "match"),
    [({"step_s": "abc"}, r"cost_model.step_s: wrong type; expected a number, found 'abc'"),
     ({"step_s": math.inf}, r"cost_model.step_s: not a finite number"),
     ({"step_s": math.nan}, r"cost_model.step_s: not a finite number"),
     ({"step_s": -1.0}, r"step_s: expected a finite number >= 0, found -1.0"),
     ({"step_s": 0, "per_token_s": 0}, r"every step would take no time"),
     ({"step_s": True}, r"cost_model.step_s: wrong type"),
     ({"per_token_s": 10**400}, r"cost_model.per_token_s: not a finite number")],
)
def test_constant_cost_params_are_checked(params, match):
    """Was: a TypeError traceback at the first step ('abc'), or inf/NaN step times in the results."""
    with pytest.raises(ConfigError, match=match):
        build_model_from_params(ConstantCostModel, params, where="cost_model", source="exp.yaml")


def test_hf_config_rejects_infinity_and_hints_misspelt_keys():
    raw = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
           "vocab_size": 256}
    with pytest.raises(ConfigError, match="rms_norm_eps: invalid value; expected a finite positive number"):
        model_from_hf_dict({**raw, "rms_norm_eps": math.inf}, source="config.json")
    typo = {k: v for k, v in raw.items() if k != "vocab_size"} | {"vocab_sise": 256}
    with pytest.raises(ConfigError, match="vocab_size: required key is missing \\(the file has 'vocab_sise'"):
        model_from_hf_dict(typo, source="config.json")


def test_union_tags_are_not_part_of_the_field_path():
    """Was: workload.arrivals.poisson.rate / policies[0].continuous.admission (pydantic's union tags)."""
    with pytest.raises(ConfigError) as err:
        parse_experiment(with_changes(**{"policies": [{"name": "continuous", "admission": "x"}]}), source="exp.yaml")
    assert "policies[0].admission" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_experiment(with_changes(**{"workload.prefix": {"num_prefixes": 1, "prefix_len": {"kind": "fixed",
                         "value": 2}, "choice": {"kind": "zipf", "q": 1}}}), source="exp.yaml")
    assert "workload.prefix.choice.q: unknown key; expected one of ['kind', 's']" in str(err.value)


def test_misspelt_key_is_reported_before_the_key_it_replaced():
    with pytest.raises(ConfigError, match=r"workload.arrivals.rat: unknown key.*did you mean 'rate'"):
        parse_experiment(with_changes(**{"workload.arrivals": {"kind": "poisson", "rat": 3}}), source="exp.yaml")


def test_strict_yaml_loader(tmp_path):
    with pytest.raises(ConfigError, match=r"line 2, column 1: invalid YAML: duplicate key 'a' \(first given at line 1"):
        parse_yaml("a: 1\na: 2\n", source="x.yaml")
    assert parse_yaml("base: &b {x: 1}\nother:\n  <<: *b\n  x: 2\n") == {"base": {"x": 1}, "other": {"x": 2}}
    (tmp_path / "bin.yaml").write_bytes(b"a: \xff\n")
    with pytest.raises(ConfigError, match="bin.yaml: experiment file is not UTF-8 text"):
        load_yaml_mapping(tmp_path / "bin.yaml")
    with pytest.raises(ConfigError, match="is a folder"):
        load_yaml_mapping(tmp_path)


# --- found by fuzzing, fix proposed for a file owned elsewhere ----------------------------------


def test_stuck_parent_with_pending_follow_up_is_a_clean_error():
    """The parent can never be admitted (watermark); its follow-up turn waits on it: SimPy ran out of
    events and raised RuntimeError instead of the engine's 'the run cannot finish' ServesimError."""
    policy = make_policy("continuous", num_blocks=2, block_size=1, admission="watermark", watermark=0.5)
    policy.rejection_reason = lambda request: None  # stuck on purpose, whatever admission rejects up front
    requests = [req(0, 0.0, 2, 1), req(1, 0.0, 5, 1, parent_id=0, think_time_s=0.0)]
    with pytest.raises(ServesimError, match="cannot finish"):
        simulate(requests, policy, ConstantCostModel())


def test_request_that_only_fits_without_the_watermark_is_rejected():
    """vLLM's can_allocate says NEVER when total blocks - needed < watermark blocks; here the request
    waits forever and the run fails as stuck instead of rejecting that one request."""
    policy = make_policy("continuous", num_blocks=2, block_size=1, admission="watermark", watermark=0.5)
    result = simulate([req(0, 0.0, 2, 1), req(1, 0.0, 1, 1)], policy, ConstantCostModel())
    assert [r.request_id for r in result.rejected] == [0] and "watermark" in result.rejected[0].reject_reason


@pytest.mark.parametrize("field", ["kv_cache.host_memory_gib", "metrics.delivery_ms", "limits.max_wall_time_s"])
def test_infinite_experiment_numbers_are_rejected(field):
    """host_memory_gib: inf was a ValueError traceback (int(nan)); delivery_ms: inf gave inf latencies."""
    section, key = field.split(".")
    data = copy.deepcopy(BASE)
    data.setdefault(section, {})[key] = math.inf
    with pytest.raises(ConfigError, match=rf"exp.yaml: {field}"):
        parse_experiment(data, source="exp.yaml")


def test_absurd_kv_sizes_are_a_config_error():
    """BlockManager and HostPool build every block up front: 10**12 blocks exhaust memory (OOM kill).
    Derived sizes too: tiny-llama on an h200 gives 34M blocks (10 s, 2.7 GB) and with block_size 1,
    550M (killed). Only resolve_kv is called here, which is cheap."""
    for changes in ({"kv_cache.num_blocks": 10**12}, {"kv_cache.host_memory_gib": 1e9}):
        exp = parse_experiment(with_changes(**changes), source="exp.yaml")
        with pytest.raises(ConfigError):
            resolve_kv(exp, source="exp.yaml")


@pytest.mark.parametrize("cv", [3.0879879739205634e-229, 1.3407807929942596e154])
def test_gamma_cv_that_would_overflow_the_shape_is_a_config_error(cv):
    # Found by test_fuzz_config: 1/cv^2 divided by zero, or became 0 and every gap NaN.
    data = with_changes(**{"workload.arrivals": {"kind": "gamma", "rate": 1.0, "cv": cv}})
    with pytest.raises(ConfigError, match="cv"):
        parse_experiment(data, source="exp.yaml")


@pytest.mark.parametrize("workload,where", [
    # Found by test_fuzz_config: exp() of a huge sigma overflowed to inf think times, and the run
    # ended with "the run cannot finish" (turns that never arrive) after numpy warnings.
    ({"sessions": {"num_sessions": 3, "turns": {"kind": "fixed", "value": 3},
                   "think_time_s": {"kind": "lognormal", "median": 2.0, "sigma": 1e300}}},
     "workload.sessions.think_time_s"),
    # Finite but huge gaps whose running sum passes the float range.
    ({"arrivals": {"kind": "constant", "rate": 1e-308}}, "workload.arrivals"),
])
def test_times_past_the_float_range_are_a_config_error(workload, where):
    import warnings

    data = copy.deepcopy(BASE)
    data["workload"] = {**data["workload"], **workload}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning on the way
        with pytest.raises(ConfigError, match=f"{where}: .* overflow the float range"):
            run(data)


def test_a_block_larger_than_any_request_is_a_config_error():
    """Found by the config fuzzer: block_size 2**63 ran (one request) until step records counted
    blocks in int64. No request is longer than 2**31 - 1 tokens, so no block need be larger."""
    expected = (r"exp.yaml: kv_cache.block_size: out of range; expected a whole number in \[1, 2147483647\], "
                r"found 9223372036854775808")
    with pytest.raises(ConfigError, match=expected):
        parse_experiment(with_changes(**{"kv_cache.block_size": 2**63}), source="exp.yaml")
    with pytest.raises(ValueError, match="block_size must be between 1 and 2147483647"):
        make_policy("continuous", num_blocks=4, block_size=2**31)
    exp = parse_experiment(with_changes(**{"kv_cache.block_size": 2**31 - 1, "kv_cache.num_blocks": 8}),
                           source="exp.yaml")
    assert run_experiment(exp, source=None).runs  # the largest block still runs


def test_a_whole_number_of_seconds_past_int64_prices_runs():
    """Found by the config fuzzer: per_token_s 2**63 (a whole number) overflowed int64 where a
    run of steps is priced in bulk; the parameters are floats now, and both paths agree."""
    model = build_model_from_params(ConstantCostModel, {"step_s": 0.03125, "per_token_s": 2**63}, where="cost_model",
                                    source="exp.yaml")
    assert isinstance(model.per_token_s, float)
    requests = [req(0, 0.0, 1, 3), req(1, 0.0, 1, 2)]
    results = []
    for fast in (False, True):
        policy = make_policy("continuous", num_blocks=8, block_size=1)
        results.append(simulate(requests, policy, model, accelerator=accelerator_for(policy) if fast else None))
    assert [r.finish_s for r in results[0].requests] == [r.finish_s for r in results[1].requests]
    assert results[1].requests[0].finish_s >= 2**63
