"""Bad input on the command line: one clear message, exit code 2, no traceback.

A representative set runs `python -m experiments.cli` in a subprocess (what a user sees); the
long list runs `experiments.cli.main` in process, where any exception other than ServesimError
would escape and fail the test (the in-process equivalent of a traceback).

Some cases once depended on changes proposed for experiments/config.py, experiments/runner.py and
simcore/errors.py; those changes are in, and the cases are ordinary tests now.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from experiments.cli import main
from tests.helpers import SMALL_EXPERIMENT

ROOT = Path(__file__).resolve().parent.parent

BASE = {**SMALL_EXPERIMENT, "policies": [{"name": "static", "max_batch_size": 4}]}


def write(folder: Path, data=None, text: str | None = None, name: str = "exp.yaml") -> Path:  # noqa: ANN001
    path = folder / name
    path.write_text(text if text is not None else yaml.safe_dump(data if data is not None else BASE))
    return path


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "experiments.cli", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=env, timeout=120)


def assert_one_clear_error(stderr: str, *fragments: str) -> None:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("servesim: error:")]
    assert len(errors) == 1, stderr
    for fragment in fragments:
        assert fragment in errors[0], f"{fragment!r} not in {errors[0]!r}"


def run_in_process(capsys, *args: str, fragments: tuple[str, ...] = ()) -> str:  # noqa: ANN001
    code = main(["run", *args, "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert_one_clear_error(err, *fragments)
    return err


def changed(**changes) -> dict:  # noqa: ANN003
    """BASE with dotted-path changes: changed(**{"kv_cache.block_size": 0})."""
    data = json.loads(json.dumps(BASE))
    for path, value in changes.items():
        node = data
        keys = path.split(".")
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(keys[-1])] = value
        else:
            node[keys[-1]] = value
    return data


# --- through a real subprocess -----------------------------------------------------------------


def test_yaml_syntax_error_names_line_and_column(tmp_path):
    path = write(tmp_path, text="name: t\nworkload:\n  num_requests: 5\n   arrivals: x\n")
    proc = cli("run", str(path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert_one_clear_error(proc.stderr, "exp.yaml", "line 4, column 12", "invalid YAML")


def test_unknown_key_suggests_the_right_one(tmp_path):
    data = changed()
    data["kv_cache"]["block_sise"] = data["kv_cache"].pop("block_size")
    proc = cli("run", str(write(tmp_path, data)), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert_one_clear_error(proc.stderr, "exp.yaml: kv_cache.block_sise: unknown key", "did you mean 'block_size'")


def test_unknown_policy_name_lists_valid_names(tmp_path):
    proc = cli("run", str(write(tmp_path, changed(**{"policies.0": {"name": "contnuous"}}))))
    assert proc.returncode == 2
    assert_one_clear_error(proc.stderr, "policies[0].name: unknown policy name",
                           "'static', 'continuous', 'chunked_prefill'", "found 'contnuous'",
                           "did you mean 'continuous'")
    assert "found 'dict'" not in proc.stderr


def test_bad_trace_cell_names_file_row_and_column(tmp_path):
    (tmp_path / "t.csv").write_text("arrival_s,prompt_len,output_len\n0,10,5\n1,abc,5\n")
    data = changed(workload={"trace": {"path": "t.csv", "format": "csv"}})
    proc = cli("run", str(write(tmp_path, data)), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert_one_clear_error(proc.stderr, "t.csv: row 2, column 'prompt_len': not a number", "found 'abc'")


def test_bad_hf_config_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 64,}')
    proc = cli("run", str(write(tmp_path, changed(model="config.json"))), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert_one_clear_error(proc.stderr, "config.json: invalid JSON at line 1")


def test_set_without_equals(tmp_path):
    proc = cli("run", str(write(tmp_path)), "--set", "workload.num_requests")
    assert proc.returncode == 2
    assert_one_clear_error(proc.stderr, "key.path=value", "found 'workload.num_requests'")


def test_argparse_errors_exit_2(tmp_path):
    proc = cli("run", str(write(tmp_path)), "--nonsense")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "unrecognized arguments" in proc.stderr
    proc = cli("kv-size", "--tokens", "0", "--model", "llama-3.1-8b")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_kv_size_unknown_model(tmp_path):
    proc = cli("kv-size", "--model", "lama-3.1-8b", "--tokens", "10")
    assert proc.returncode == 2
    assert_one_clear_error(proc.stderr, "unknown model", "did you mean 'llama-3.1-8b'")


def test_missing_experiment_file(tmp_path):
    proc = cli("run", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2
    assert_one_clear_error(proc.stderr, "nope.yaml", "not found")


def test_internal_errors_keep_their_traceback(tmp_path):
    code = ("import sys, experiments.cli as cli, experiments.commands.run as run\n"
            "def broken(args):\n    raise ZeroDivisionError('an internal bug')\n"
            "run.run = broken\nsys.exit(cli.main(['run', 'x.yaml']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "ZeroDivisionError: an internal bug" in proc.stderr


# --- in process: every kind of bad input ----------------------------------------------------------

EXPERIMENT_CASES = [
    # (id, changes to BASE, fragments the one error line must contain)
    ("wrong-type", {"kv_cache.block_size": "abc"}, ("kv_cache.block_size: wrong type", "whole number", "'abc'")),
    ("fraction", {"kv_cache.block_size": 1.5}, ("kv_cache.block_size", "whole number", "1.5")),
    ("zero", {"kv_cache.block_size": 0}, ("kv_cache.block_size: out of range", "[1, 2147483647]", "found 0")),
    ("negative-rate", {"workload.arrivals.rate": -2}, ("workload.arrivals.rate: out of range", "> 0", "-2")),
    ("nan", {"workload.arrivals.rate": float("nan")}, ("workload.arrivals.rate: not a finite number",)),
    ("inf", {"workload.arrivals.rate": float("inf")}, ("workload.arrivals.rate: not a finite number",)),
    ("fraction-range", {"kv_cache.gpu_memory_utilization": 2}, ("gpu_memory_utilization", "(0, 1]", "found 2")),
    ("nested-typo", {"workload.arrivals": {"kind": "poisson", "rat": 3}},
     ("workload.arrivals.rat: unknown key", "did you mean 'rate'")),
    ("kind-typo", {"workload.arrivals.kind": "poison"},
     ("workload.arrivals.kind: unknown arrivals kind", "'poisson'", "did you mean 'poisson'")),
    ("kind-missing", {"workload.prompt_len": {"low": 1, "high": 3}},
     ("workload.prompt_len.kind: required key is missing", "'uniform'")),
    ("literal", {"policies.0": {"name": "continuous", "admission": "reserv"}},
     ("policies[0].admission: invalid value", "'optimistic', 'prompt', 'reserve', 'watermark'", "did you mean 'reserve'")),
    ("policy-no-name", {"policies.0": {"max_batch_size": 3}},
     ("policies[0].name: required key is missing", "'static'")),
    ("policy-not-mapping", {"policies.0": "static"}, ("policies[0]: wrong type", "mapping", "'static'")),
    ("no-policies", {"policies": []}, ("policies: too few items", "at least 1")),
    ("policy-key", {"policies.0": {"name": "static", "chunk_size": 3}},
     ("policies[0].chunk_size: unknown key", "max_batch_size")),
    ("static-budget", {"policies.0": {"name": "static", "max_num_batched_tokens": 2048}},
     ("policies[0].max_num_batched_tokens: unknown key", "max_batch_size")),
    ("static-admission", {"policies.0": {"name": "static", "admission": "watermark"}},
     ("policies[0].admission: unknown key",)),
    ("static-prefix-cache", {"policies.0": {"name": "static", "prefix_caching": True}},
     ("policies[0].prefix_caching", "static batching has no prefix cache", "found True")),
    ("static-inherits-prefix-cache", {"kv_cache.prefix_caching": True},
     ("policies[0].prefix_caching: static batching has no prefix cache", "kv_cache.prefix_caching is true",
      "set prefix_caching: false")),
    ("case-typo", {"policies.0": {"name": "static", "MAX_BATCH_SIZE": 3}},
     ("policies[0].MAX_BATCH_SIZE: unknown key", "did you mean 'max_batch_size'")),
    ("workload-missing-len", {"workload.prompt_len": None}, ("workload: a synthetic workload needs ['prompt_len']",)),
    ("workload-not-mapping", {"workload": [1, 2]}, ("workload: wrong type", "mapping", "a list of 2")),
    ("dtype", {"kv_cache.dtype": "bf61"}, ("kv_cache.dtype: unknown KV dtype 'bf61'", "did you mean 'bf16'")),
    ("model-preset", {"model": "lama-3.1-8b"}, ("model: unknown model", "did you mean 'llama-3.1-8b'")),
    ("model-type", {"model": 5}, ("model: wrong type", "a string", "found 5")),
    ("hardware", {"hardware": "h100-sx"}, ("hardware: unknown hardware", "did you mean 'h100-sxm'")),
    ("cost-name", {"cost_model": {"name": "rooflin"}}, ("cost_model.name: unknown cost model", "'roofline'")),
    ("cost-key", {"cost_model": {"name": "constant", "step_ss": 1}},
     ("cost_model.step_ss: unknown key", "did you mean 'step_s'")),
    ("cost-type", {"cost_model": {"name": "constant", "step_s": "abc"}},
     ("cost_model.step_s: wrong type", "a number", "'abc'")),
    ("cost-negative", {"cost_model": {"name": "constant", "step_s": -1}}, ("cost_model", "step_s", ">= 0", "-1")),
    ("cost-inf", {"cost_model": {"name": "constant", "step_s": float("inf")}}, ("cost_model.step_s", "finite")),
    ("cost-all-zero", {"cost_model": {"name": "constant", "step_s": 0}}, ("cost_model", "no time")),
    ("roofline-key", {"cost_model": {"name": "roofline", "mfuu": 0.5}}, ("cost_model.mfuu", "did you mean 'mfu'")),
    ("roofline-range", {"cost_model": {"name": "roofline", "mfu": 2}}, ("cost_model", "mfu", "found 2")),
    ("slo", {"metrics": {"slo": {"ttft_ms": 0}}}, ("metrics.slo.ttft_ms: out of range", "> 0")),
    ("labels", {"policies": [{"name": "static", "label": "a"}, {"name": "continuous", "label": "a"}]},
     ("policy labels must be unique",)),
    ("trace-format", {"workload": {"trace": {"path": "t.csv", "format": "cvs"}}},
     ("workload.trace.format: unknown trace format", "did you mean 'csv'")),
    ("trace-option", {"workload": {"trace": {"path": "t.csv", "format": "csv", "time_scal": 2}}},
     ("workload.trace.time_scal: unknown key", "did you mean 'time_scale'")),
    ("trace-union", {"workload": {"trace": {"path": "t.csv", "format": "burstgpt", "model": 5}}},
     ("workload.trace.model: wrong type", "a string or a list")),
    ("huge-count", {"workload.num_requests": 10**30}, ("workload.num_requests: out of range",)),
    ("huge-length", {"workload.prompt_len": {"kind": "fixed", "value": 2**40}}, ("workload.prompt_len.value",)),
    ("host-tier", {"policies.0": {"name": "offload"}}, ("needs a host tier",)),
]


@pytest.mark.parametrize(("changes", "fragments"), [c[1:] for c in EXPERIMENT_CASES],
                         ids=[c[0] for c in EXPERIMENT_CASES])
def test_bad_experiment_values(tmp_path, capsys, changes, fragments):
    data = changed(**changes)
    run_in_process(capsys, str(write(tmp_path, data)), "--out", str(tmp_path / "out"), fragments=("exp.yaml", *fragments))


FILE_CASES = [
    ("empty", "", ("an experiment file must be a mapping",)),
    ("list", "- a\n- b\n", ("must be a mapping",)),
    ("tab", "name: t\n\tseed: 1\n", ("line 2, column 1", "invalid YAML")),
    ("unclosed", "name: t\nworkload: {num_requests: 5\n", ("invalid YAML",)),
]


@pytest.mark.parametrize(("text", "fragments"), [c[1:] for c in FILE_CASES], ids=[c[0] for c in FILE_CASES])
def test_bad_experiment_files(tmp_path, capsys, text, fragments):
    run_in_process(capsys, str(write(tmp_path, text=text)), fragments=("exp.yaml", *fragments))


def test_experiment_path_is_a_folder(tmp_path, capsys):
    run_in_process(capsys, str(tmp_path))


TRACE_CASES = [
    ("csv", "t.csv", "arrival_s,prompt_len\n0,10\n", ("header: missing column 'output_len'",)),
    ("csv-cell", "t.csv", "arrival_s,prompt_len,output_len\n0,10,5\n1,-3,5\n",
     ("row 2, column 'prompt_len': bad token count", ">= 1", "found -3")),
    ("csv-empty-cell", "t.csv", "arrival_s,prompt_len,output_len\n0,10,5\n1,,5\n", ("row 2, column 'prompt_len': empty or NaN cell",)),
    ("csv-huge", "t.csv", "arrival_s,prompt_len,output_len\n0,10,5\n1,1e30,5\n",
     ("row 2, column 'prompt_len': bad token count", "at most")),
    ("csv-inf", "t.csv", "arrival_s,prompt_len,output_len\ninf,10,5\n", ("row 1, column 'arrival_s'", "non-finite")),
    ("csv-ragged", "t.csv", "arrival_s,prompt_len,output_len\n0,10,5\n1,10,5,7\n", ("not a readable CSV file",)),
    ("csv-no-rows", "t.csv", "arrival_s,prompt_len,output_len\n", ("the trace gives no requests",)),
    ("jsonl", "t.jsonl", '{"arrival_s": 0, "prompt_len": 10, "output_len": 5}\n{"arrival_s": 1,\n',
     ("line 2: invalid JSON",)),
    ("jsonl-missing", "t.jsonl", '{"arrival_s": 0, "output_len": 5, "prompt_len": 3}\n{"arrival_s": 1, "output_len": 5}\n',
     ("line 2, column 'prompt_len': missing or NaN value",)),
    ("jsonl-content", "t.jsonl", '{"arrival_s": 0, "prompt_len": 10, "output_len": 5, "prompt_token_ids": [1, 2]}\n',
     ("prompt_len disagrees with the prompt content", "found 10")),
    ("mooncake", "m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": "x"}\n',
     ("line 1, column 'hash_ids': hash_ids must be a list of integers",)),
    ("azure", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nxx,10,5\n", ("row 1, column 'TIMESTAMP': not a timestamp",)),
    ("azure-header", "a.csv", "time,in,out\n0,1,1\n", ("header: not an Azure trace header",)),
    ("burstgpt", "b.csv", "Timestamp,Model\n0,x\n", ("header: missing column 'Request tokens'",)),
    ("sharegpt", "s.json", '[{"conversations": [{"from": "humn", "value": "hi"}]}]',
     ("conversation 1, message 1, field 'from': unknown speaker", "did you mean 'human'")),
    ("sharegpt-json", "s.json", "[{", ("invalid JSON",)),
]
FORMATS = {"t.csv": "csv", "t.jsonl": "jsonl", "m.jsonl": "mooncake", "a.csv": "azure", "b.csv": "burstgpt",
           "s.json": "sharegpt"}


@pytest.mark.parametrize(("name", "text", "fragments"), [c[1:] for c in TRACE_CASES], ids=[c[0] for c in TRACE_CASES])
def test_bad_trace_files(tmp_path, capsys, name, text, fragments):
    (tmp_path / name).write_text(text)
    workload = {"trace": {"path": name, "format": FORMATS[name]}}
    if FORMATS[name] == "sharegpt":
        workload["arrivals"] = {"kind": "poisson", "rate": 1.0}
    run_in_process(capsys, str(write(tmp_path, changed(workload=workload))), "--out", str(tmp_path / "out"),
                   fragments=(name, *fragments))


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "mooncake", "azure", "burstgpt", "sharegpt", "parquet"])
def test_non_utf8_and_missing_trace_files(tmp_path, capsys, fmt):
    (tmp_path / "bad.bin").write_bytes(b"\xff\xfe\x00junk\n\x80\x81\n")
    workload = {"trace": {"path": "bad.bin", "format": fmt}}
    if fmt == "sharegpt":
        workload["arrivals"] = {"kind": "poisson", "rate": 1.0}
    run_in_process(capsys, str(write(tmp_path, changed(workload=workload))), "--out", str(tmp_path / "out"),
                   fragments=("bad.bin",))
    workload["trace"]["path"] = "missing.csv"
    run_in_process(capsys, str(write(tmp_path, changed(workload=workload))), "--out", str(tmp_path / "out"),
                   fragments=("workload.trace.path: trace file not found", "missing.csv"))


HF_BASE = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}
HF_CASES = [
    ("string", {"hidden_size": "64"}, ("config.json: hidden_size: invalid value", "positive integer", "'64'")),
    ("typo", {"hidden_size": None, "hiden_size": 64}, ("hidden_size: required key is missing", "'hiden_size'")),
    ("arch", {"architectures": ["LlamaForCausalLm"]}, ("unsupported architecture", "did you mean 'LlamaForCausalLM'")),
    ("heads", {"num_key_value_heads": 3}, ("not divisible by num_key_value_heads",)),
    ("inf", {"rms_norm_eps": float("inf")}, ("rms_norm_eps: invalid value", "finite")),
    ("list", None, ("must hold a JSON object",)),
]


@pytest.mark.parametrize(("changes", "fragments"), [c[1:] for c in HF_CASES], ids=[c[0] for c in HF_CASES])
def test_bad_hf_config(tmp_path, capsys, changes, fragments):
    raw = [1, 2] if changes is None else {k: v for k, v in {**HF_BASE, **changes}.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    run_in_process(capsys, str(write(tmp_path, changed(model="config.json", hardware="cpu"))), "--out",
                   str(tmp_path / "out"), fragments=fragments)


SET_CASES = [
    pytest.param(["seed"], ("override must look like key.path=value",), id="no-equals"),
    pytest.param(["policies.3.name=static"], ("policies.3: list index out of range",), id="bad-index"),
    pytest.param(["policies.first.name=static"], ("list index out of range", "'first'"), id="word-index"),
    pytest.param(["kv_cach.block_size=3"], ("kv_cach: unknown key", "did you mean 'kv_cache'"), id="unknown"),
    pytest.param(["workload.num_requests=many"], ("workload.num_requests: wrong type", "'many'"), id="value-type"),
    pytest.param(["seed=[1"], ("--set seed", "invalid YAML"), id="bad-yaml"),
    pytest.param(["name.x.y=1"], ("name", "not a mapping"), id="into-scalar"),
    pytest.param(["=1"], ("dotted key path",), id="empty-key"),
]


@pytest.mark.parametrize(("overrides", "fragments"), SET_CASES)
def test_bad_set_overrides(tmp_path, capsys, overrides, fragments):
    args = [arg for item in overrides for arg in ("--set", item)]
    run_in_process(capsys, str(write(tmp_path)), "--out", str(tmp_path / "out"), *args, fragments=fragments)


# --- cases that need a proposed change in a file owned elsewhere -----------------------------------


def test_duplicate_yaml_key_is_an_error(tmp_path, capsys):
    text = yaml.safe_dump(BASE) + "name: again\n"
    run_in_process(capsys, str(write(tmp_path, text=text)), fragments=("exp.yaml", "duplicate key 'name'"))


def test_non_utf8_experiment_file(tmp_path, capsys):
    path = tmp_path / "exp.yaml"
    path.write_bytes(b"name: \xff\xfe\n")
    run_in_process(capsys, str(path), fragments=("exp.yaml", "UTF-8"))


def test_negative_seed_names_the_file(tmp_path, capsys):
    run_in_process(capsys, str(write(tmp_path, changed(seed=-1))), fragments=("exp.yaml", "seed"))


def test_tensor_parallel_mismatch_names_the_file(tmp_path, capsys):
    run_in_process(capsys, str(write(tmp_path, changed(tensor_parallel=3))), fragments=("exp.yaml", "tensor_parallel"))


def test_hardware_prefix_suggests_the_full_name(tmp_path, capsys):
    run_in_process(capsys, str(write(tmp_path, changed(hardware="h100"))), fragments=("did you mean 'h100-sxm'",))


def test_unusable_out_folder(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    run_in_process(capsys, str(write(tmp_path)), "--out", str(tmp_path / "a_file"), fragments=("--out", "a_file"))


def test_a_run_that_fails_before_writing_leaves_no_empty_folder(tmp_path, capsys):
    data = changed(**{"workload": {"trace": {"path": "missing.csv", "format": "csv"}}})
    exp = str(write(tmp_path, data))
    run_in_process(capsys, exp, "--out", str(tmp_path / "new" / "results"), fragments=("trace file not found",))
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()  # a folder that was there before is the user's: it stays
    run_in_process(capsys, exp, "--out", str(tmp_path / "mine" / "results"), fragments=("trace file not found",))
    assert (tmp_path / "mine").is_dir() and not (tmp_path / "mine" / "results").exists()


def test_a_reader_that_goes_away_ends_the_output_quietly(tmp_path):
    """`servesim report DIR | head` ended in a BrokenPipeError traceback."""
    assert main(["run", str(write(tmp_path, BASE)), "--out", str(tmp_path / "out")]) == 0
    process = subprocess.Popen([sys.executable, "-m", "experiments.cli", "report", str(tmp_path / "out")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    process.stdout.close()  # gone before the table is printed
    stderr = process.stderr.read().decode()
    assert process.wait() == 141 and stderr == "", stderr


def test_every_mistake_of_a_file_is_reported_at_once(tmp_path):
    data = {**BASE, "seed": -1, "workload": {**BASE["workload"], "rat": 3},
            "policies": [{"name": "continuous", "admission": "reserv", "max_num_seqs": 0}]}
    result = cli("run", str(write(tmp_path, data)), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    first, *others = result.stderr.strip().splitlines()
    assert first.startswith("servesim: error: ") and first.endswith("seed: out of range; expected a whole number "
                                                                       ">= 0, found -1")
    assert [line.split(": ")[2] for line in others] == ["workload.rat", "policies[0].max_num_seqs",
                                                           "policies[0].admission"]
    assert all(line.startswith("  also: ") for line in others)
    assert "did you mean 'reserve'" in others[-1]


def test_a_misspelt_key_is_not_also_reported_missing(tmp_path):
    workload = {key: value for key, value in BASE["workload"].items() if key != "arrivals"}
    result = cli("run", str(write(tmp_path, {**BASE, "workload": {**workload, "arival": BASE["workload"]["arrivals"]}})))
    assert result.returncode == 2 and "also:" not in result.stderr, result.stderr
