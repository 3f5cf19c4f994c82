"""Inputs past what servesim can honour are refused quickly, in messages of bounded length:
YAML size, alias expansion, nesting and number limits; values shown in messages; key paths;
workload counts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from experiments.cli import main
from experiments.config import load_experiment, parse_experiment
from simcore.errors import ConfigError, close_match, short_repr
from simcore.validate import (
    MAX_PATH_PARTS,
    MAX_YAML_CHARS,
    MAX_YAML_DEPTH,
    YamlLimitError,
    load_yaml_mapping,
    load_yaml_text,
    parse_yaml,
    set_path,
)
from tests.helpers import HANG_S
from workloads.spec import MAX_COUNT, parse_workload

WORKLOAD = """\
workload:
  num_requests: 5
  arrivals: {kind: poisson, rate: 1}
  prompt_len: &len {kind: fixed, value: 3}
  output_len: *len
policies: [{name: continuous}]
"""


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def laughs(levels: int, width: int = 9) -> str:
    """A 'billion laughs' mapping: level i lists `width` aliases of level i - 1."""
    lines = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


# --- YAML ----------------------------------------------------------------------------------------


def test_ordinary_aliases_still_work(tmp_path):
    exp = load_experiment(write(tmp_path, WORKLOAD))
    assert exp.workload.output_len == exp.workload.prompt_len


def test_an_alias_bomb_is_refused_at_the_anchor_that_gets_too_large(tmp_path):
    path = write(tmp_path, "name: x\n" + laughs(9))  # 9**9 = 387M values written out, 700 bytes
    started = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        load_yaml_mapping(path)
    assert time.perf_counter() - started < HANG_S
    # l6, on line 8, is 9**7 values written out, 20 M characters: the first past 4 MiB.
    assert str(err.value) == (
        f"{path}: line 8, column 5: YAML too large: with its aliases written out, this value would have more "
        f"than {MAX_YAML_CHARS:,} characters (the most a YAML input may have); write it without nested aliases")


def test_an_expansion_just_within_the_limit_is_read():
    data = parse_yaml(laughs(6))  # 9**6 = 531,441 values, 2.7 M characters written out
    assert len(data["l5"]) == 9 and data["l5"][0] is data["l5"][1]


def test_an_alias_that_contains_itself_is_refused():
    for text in ("a: &a [1, *a]", "a: &a {b: *a}", "a: &a {<<: *a}", "a: &a [[[*a]]]"):
        with pytest.raises(ConfigError, match=r"^x.yaml: line 1, column \d+: invalid YAML: an alias refers to a "
                                              r"value that contains it"):
            parse_yaml(text, source="x.yaml")


def test_nesting_is_limited():
    depth = MAX_YAML_DEPTH - 1  # the top-level mapping is a level too
    assert parse_yaml("a: " + "[" * depth + "]" * depth)
    with pytest.raises(ConfigError, match=f"YAML too deep: lists and mappings nested more than {MAX_YAML_DEPTH}"):
        parse_yaml("a: " + "[" * (depth + 1) + "]" * (depth + 1))
    with pytest.raises(ConfigError, match="YAML too deep: lists and mappings nested too deeply"):
        parse_yaml("a: " + "[" * 5000 + "]" * 5000)  # past the parser's own recursion


def test_a_large_file_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "large.yaml"
    with path.open("wb") as stream:
        stream.truncate(4 * MAX_YAML_CHARS + 10)  # sparse: nothing is written
    with pytest.raises(ConfigError, match=r"large\.yaml: experiment file is too large; expected at most "
                                          r"4,194,304 characters, found more than 16,777,216 bytes"):
        load_yaml_mapping(path)
    text = "a: '" + "é" * MAX_YAML_CHARS + "'\n"  # under the byte limit, over the character limit
    with pytest.raises(ConfigError, match=r"too large; expected at most 4,194,304 characters, found 4,194,310 characters"):
        load_yaml_mapping(write(tmp_path, text))
    with pytest.raises(ConfigError, match="YAML too large: the text has 4,194,305 characters"):
        parse_yaml("#" * (MAX_YAML_CHARS + 1))


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_an_endless_file_is_refused():
    with pytest.raises(ConfigError, match="experiment file is too large"):
        load_yaml_mapping("/dev/zero")


@pytest.mark.parametrize(("value", "pattern"), [
    ("9" * 5000, "a whole number past the 4,300 decimal digits Python reads"),
    ("0x" + "f" * 4000, "a whole number past the 4,300 decimal digits Python reads"),
    ("0b" + "1" * 15000, "a whole number past the 4,300 decimal digits Python reads"),
    ("2024-13-45", r"cannot read '2024-13-45' as a date \(month must be in 1\.\.12\)"),
])
def test_values_python_cannot_read_or_print_are_yaml_errors(value, pattern):
    with pytest.raises(ConfigError, match=rf"^x.yaml: line 1, column 7: invalid YAML: {pattern}"):
        parse_yaml(f"seed: {value}", source="x.yaml")
    assert parse_yaml("seed: " + "9" * 4000)["seed"] == int("9" * 4000)


def test_load_yaml_text_refusals_are_yaml_errors():
    """For yaml.safe_load's callers (calibration files): they catch yaml.YAMLError."""
    assert load_yaml_text("a: &a [1]\nb: *a") == {"a": [1], "b": [1]}
    for text in (laughs(9), "a: &a [*a]", "a: " + "[" * 200 + "]" * 200, "a: 0x" + "f" * 4000):
        with pytest.raises(yaml.YAMLError):
            load_yaml_text(text)
    with pytest.raises(YamlLimitError):
        load_yaml_text(laughs(9))


def test_calibration_files_share_the_limits(tmp_path):
    from backends.calibration import load_calibration

    path = write(tmp_path, "kind: roofline-calibration\n" + laughs(9), "bomb.calib.yaml")
    with pytest.raises(ConfigError, match="bomb.calib.yaml is not valid YAML at line 8"):
        load_calibration(path)


def test_flag_values_share_the_limits(tmp_path, capsys):
    path = write(tmp_path, WORKLOAD)
    bomb = "[" + ", ".join(f"&a{i} [" + ", ".join([f"*a{i - 1}" if i else "x"] * 9) + "]" for i in range(9)) + "]"
    assert main(["run", str(path), "--set", f"seed={bomb}", "--out", str(tmp_path / "out")]) == 2
    assert "--set seed, line 1, column" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# --- messages ------------------------------------------------------------------------------------


def test_short_repr_is_bounded_for_any_value():
    nested: object = ["x"] * 9
    for _ in range(9):
        nested = [nested] * 9  # 9**10 values written out
    loop: list = [1]
    loop.append(loop)
    assert len(short_repr(nested)) <= 100 and short_repr(nested).startswith("[[[[...], [...],")
    assert short_repr(loop) == "[1, [1, [1, [...]]]]"
    assert short_repr(10**5000) == "<a whole number of about 5,001 digits>"
    assert short_repr(-(2**1024)) == "<a negative whole number of 309 digits>"
    assert short_repr("x" * 10**6).startswith("'xxx") and len(short_repr("x" * 10**6)) == 100
    for small in (12, 1.5, "abc", [1, 2], {"a": 1}, True, None):
        assert short_repr(small) == repr(small)


def test_config_errors_show_a_bounded_value():
    err = ConfigError("wrong type", source="f.yaml", where="seed", expected="a whole number", found=list(range(10**6)))
    assert str(err) == "f.yaml: seed: wrong type; expected a whole number, found [0, 1, 2, 3, 4, 5, ...]"
    assert "a whole number of 401 digits" in str(ConfigError("out of range", found=10**400))
    assert close_match("x" * 10_000, ["x"]) is None  # no spelling hint for a word that long


def test_pydantic_errors_show_a_bounded_value():
    data = parse_yaml(WORKLOAD)
    data["workload"]["arrivals"]["rate"] = 10**400
    with pytest.raises(ConfigError, match=r"^f.yaml: workload.arrivals.rate: not a finite number; expected a finite "
                                          r"number > 0, found <a whole number of 401 digits>$"):
        parse_experiment(data, source="f.yaml")
    data = parse_yaml(WORKLOAD)
    data["workload"]["prompt_len"] = {"kind": "empirical", "values": ["x"] * 200_000}  # 200,000 errors
    started = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        parse_experiment(data, source="f.yaml")
    assert time.perf_counter() - started < HANG_S and len(str(err.value)) < 300


def test_key_paths_are_limited():
    data: dict = {}
    set_path(data, ".".join(["a"] * MAX_PATH_PARTS), 1)
    with pytest.raises(ConfigError, match=f"key path too long; expected at most {MAX_PATH_PARTS} dotted parts"):
        set_path(data, ".".join(["a"] * 100_000), 1)


# --- workload counts -----------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["num_requests", "sessions.num_sessions", "prefix.num_prefixes"])
def test_counts_are_limited(key):
    spec = {"num_requests": 5, "arrivals": {"kind": "poisson", "rate": 1.0},
            "prompt_len": {"kind": "fixed", "value": 3}, "output_len": {"kind": "fixed", "value": 3},
            "prefix": {"num_prefixes": 2, "prefix_len": {"kind": "fixed", "value": 4}},
            "sessions": {"num_sessions": 2, "turns": {"kind": "fixed", "value": 2},
                         "think_time_s": {"kind": "fixed", "value": 0.0}}}
    section, _, field = key.rpartition(".")
    (spec[section] if section else spec)[field] = MAX_COUNT
    parse_workload(spec)
    (spec[section] if section else spec)[field] = MAX_COUNT + 1
    with pytest.raises(ConfigError, match=rf"workload.{key}: out of range; expected a whole number in "
                                          rf"\[1, {MAX_COUNT}\], found {MAX_COUNT + 1}"):
        parse_workload(spec, source="exp.yaml")


def test_turns_of_all_sessions_are_limited_before_they_are_drawn():
    from workloads.spec import build_requests

    spec = parse_workload({"arrivals": {"kind": "poisson", "rate": 1.0}, "prompt_len": {"kind": "fixed", "value": 3},
                           "output_len": {"kind": "fixed", "value": 3},
                           "sessions": {"num_sessions": 1000, "turns": {"kind": "fixed", "value": 2**31 - 1},
                                        "think_time_s": {"kind": "fixed", "value": 0.0}}})
    with pytest.raises(ConfigError, match="too many turns in all"):
        build_requests(spec, seed=0, base_dir=Path("."))


def test_a_long_key_is_cut_short_in_messages():
    data = parse_yaml(WORKLOAD)
    data["kv_cache"] = {"x" * 100_000: 1}
    with pytest.raises(ConfigError) as err:
        parse_experiment(data, source="f.yaml")
    assert str(err.value).startswith("f.yaml: kv_cache." + "x" * 97 + "...: unknown key; expected one of [")
    assert len(str(err.value)) < 500
    assert len(str(ConfigError("m" * 10**6, source="s" * 10**6, where="w" * 10**6, expected="e" * 10**6))) < 4100


def test_a_run_past_the_memory_budget_is_refused_before_it_runs(monkeypatch):
    from experiments import runner
    from tests.helpers import SMALL_EXPERIMENT

    exp = parse_experiment({**SMALL_EXPERIMENT, "policies": [{"name": "continuous"}, {"name": "chunked_prefill"}]},
                           source="exp.yaml")
    # 5 requests, two policies: 5 x (1,700 + 350) bytes.
    monkeypatch.setattr(runner, "MEMORY_BUDGET", 5 * 2050 - 1)
    with pytest.raises(ConfigError, match=r"exp.yaml: workload: 5 requests for 2 policies would take .*"
                                          r"expected at most 4 requests for 2 policies"):
        runner.run_experiment(exp, source="exp.yaml")
    monkeypatch.setattr(runner, "MEMORY_BUDGET", 5 * 2050)
    assert len(runner.run_experiment(exp, source="exp.yaml").runs) == 2
    # The schema's largest workload runs with five policies, not with six.
    monkeypatch.undo()
    runner._check_memory(5_000_000, 5, source=None)
    with pytest.raises(ConfigError, match="5,000,000 requests for 6 policies"):
        runner._check_memory(5_000_000, 6, source=None)
