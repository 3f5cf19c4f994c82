"""vLLM `bench serve` JSON: export in its layout, read it back, compare with simulated results."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from experiments.cli import main
from experiments.vllm_interop import compare_rows, read_vllm
from simcore.errors import ConfigError
from tests.test_sweep_run import TINY, write_yaml

REAL = Path(__file__).parent / "data" / "vllm" / "synthetic_llama8b_rate4.json"
VLLM_KEYS = ("date", "backend", "model_id", "tokenizer_id", "num_prompts", "request_rate", "burstiness",
             "max_concurrency", "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
             "request_throughput", "output_throughput", "total_token_throughput", "input_lens", "output_lens",
             "ttfts", "itls", "errors", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
             "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms",
             "max_output_tokens_per_s", "max_concurrent_requests")


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vllm")
    source = write_yaml(root, dict(TINY, sweep=None))
    assert main(["run", str(source), "--out", str(root / "run"), "--quiet"]) == 0
    return root / "run"


def test_export_has_the_vllm_layout(run_folder: Path, monkeypatch, capsys):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    assert main(["export", "--vllm", str(run_folder)]) == 0
    assert capsys.readouterr().out.split() == [str(run_folder / "vllm" / "continuous.json"),
                                               str(run_folder / "vllm" / "chunked_prefill.json")]
    data = json.loads((run_folder / "vllm" / "continuous.json").read_text())
    assert all(key in data for key in VLLM_KEYS)
    assert "generated_texts" not in data
    assert data["date"] == "19700101-000000" and data["request_rate"] == 8.0 and data["burstiness"] == 1.0
    n = data["num_prompts"]
    assert n == 12 and all(len(data[k]) == n for k in ("input_lens", "output_lens", "ttfts", "itls", "errors"))
    assert all(len(itl) == max(0, out - 1) for itl, out in zip(data["itls"], data["output_lens"], strict=True))
    summary = json.loads((run_folder / "continuous" / "summary.json").read_text())
    assert data["p99_ttft_ms"] == summary["p99_ttft_ms"]
    requests = pd.read_parquet(run_folder / "continuous" / "requests.parquet").sort_values("request_id")
    assert data["ttfts"] == pytest.approx(requests["ttft_s"].tolist())


def test_export_one_policy_to_a_file(run_folder: Path, tmp_path: Path):
    target = tmp_path / "one.json"
    assert main(["export", "--vllm", str(run_folder), "--policy", "chunked_prefill", "--out", str(target)]) == 0
    assert json.loads(target.read_text())["label"] == "chunked_prefill"
    assert main(["export", "--vllm", str(run_folder), "--out", str(tmp_path / "two.json")]) == 2


def test_round_trip_compares_with_zero_error(run_folder: Path, capsys):
    assert main(["export", "--vllm", str(run_folder), "--policy", "continuous"]) == 0
    exported = run_folder / "vllm" / "continuous.json"
    capsys.readouterr()
    assert main(["compare", str(exported), str(run_folder), "--policy", "continuous", "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "p99_ttft_ms" in out and "+0.0" in out
    rows = json.loads((run_folder / "compare" / "compare.json").read_text())["rows"]["continuous"]
    assert rows and all(abs(r["rel_err"]) < 1e-12 for r in rows if r["rel_err"] is not None)


def test_compare_with_a_real_result(run_folder: Path, capsys):
    assert main(["compare", str(REAL), str(run_folder)]) == 0
    out = capsys.readouterr().out
    assert "meta-llama/Llama-3.1-8B-Instruct" in out and "err %" in out
    # TINY draws 12 requests at 8 req/s; the real file has 40 at 4 req/s.
    assert "warning: workload mismatch: num_prompts differs: real 40, simulated 12" in out
    assert "request_rate differs: real 4, simulated 8 req/s" in out
    assert (run_folder / "compare" / "compare.png").is_file() and (run_folder / "compare" / "compare.svg").is_file()
    rows = compare_rows(read_vllm(REAL), {"mean_ttft_ms": 2 * read_vllm(REAL)["mean_ttft_ms"]})
    assert rows == [{"metric": "mean_ttft_ms", "real": read_vllm(REAL)["mean_ttft_ms"],
                     "sim": 2 * read_vllm(REAL)["mean_ttft_ms"], "rel_err": 1.0}]


def test_read_vllm_rejects_other_files(tmp_path: Path):
    (tmp_path / "x.json").write_text('{"hello": 1}')
    with pytest.raises(ConfigError, match="not a vLLM bench serve result"):
        read_vllm(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_vllm(tmp_path / "y.json")


def test_compare_leaves_out_metrics_the_real_file_lacks(run_folder: Path, tmp_path: Path, capsys):
    # `vllm bench serve` writes no E2EL statistics unless --percentile-metrics asks for them.
    real = {k: v for k, v in read_vllm(REAL).items() if "e2el" not in k}
    (tmp_path / "real.json").write_text(json.dumps(real))
    assert main(["compare", str(tmp_path / "real.json"), str(run_folder), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert "no E2EL statistics" in out and "e2el" not in out.split("note:")[0]
    assert (tmp_path / "cmp" / "compare.png").is_file()
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["workload_mismatches"]["continuous"]


def test_a_matching_workload_is_said_to_match():
    from experiments.report_compare import workload_mismatches

    real = read_vllm(REAL)
    assert workload_mismatches(real, dict(real)) == []
    # Within 5% is a match; "inf" (all at once) against a rate is not.
    close = dict(real, input_lens=[n * 1.04 for n in real["input_lens"]])
    assert workload_mismatches(real, close) == []
    found = workload_mismatches(real, dict(real, request_rate="inf", output_lens=[1] * 40))
    assert [m.split(" differs")[0] for m in found] == ["mean output length", "request_rate"]
