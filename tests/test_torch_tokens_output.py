"""`record_tokens: true`: the tokens the real engine selected reach requests.parquet and the JSONL
export, and they are the tokens transformers' greedy generation picks from the same checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from experiments.cli import main  # noqa: E402
from tests.test_torch_support import hf_model, tiny_spec  # noqa: E402

# request -> (prompt ids, output length); the prompts span several 16-token blocks.
REQUESTS = {
    0: ([(3 + 7 * i) % 128 for i in range(21)], 9),
    1: ([(50 + 11 * i) % 128 for i in range(5)], 12),
    2: ([(9 + 5 * i) % 128 for i in range(40)], 1),
    3: ([(77 + 3 * i) % 128 for i in range(17)], 6),
}

EXPERIMENT = """
name: recorded_tokens
seed: 0
model: checkpoint/config.json
hardware: cpu
kv_cache: {{block_size: 16, num_blocks: 24, prefix_caching: false}}
workload: {{trace: {{path: trace.jsonl, format: jsonl}}}}
cost_model: {{name: torch, device: cpu, dtype: fp32, weights: checkpoint, record_tokens: true, warmup_rounds: 0}}
output: {{format: {fmt}, plots: false}}
policies:
  - {{name: continuous}}
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, object]:
    """A tiny Llama checkpoint with random weights, saved as transformers saves one."""
    folder = tmp_path_factory.mktemp("tokens")
    # Seed 3: greedy outputs that vary within each request (many seeds repeat one token).
    hf = hf_model(tiny_spec(), seed=3)
    hf.save_pretrained(folder / "checkpoint")
    # Each request's output length decides where it stops, as with ignore_eos.
    hf.generation_config.eos_token_id = None
    lines = [json.dumps({"arrival_s": 0.01 * rid, "prompt_token_ids": prompt, "output_len": n})
             for rid, (prompt, n) in REQUESTS.items()]
    (folder / "trace.jsonl").write_text("\n".join(lines) + "\n")
    return folder, hf


def _run(folder: Path, fmt: str) -> Path:
    path = folder / f"exp_{fmt}.yaml"
    path.write_text(EXPERIMENT.format(fmt=fmt))
    out = folder / f"out_{fmt}"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    return out


def _greedy(hf, prompt: list[int], n: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, use_cache=True,
                      attention_mask=torch.ones(1, len(prompt), dtype=torch.long), pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_requests_parquet_holds_the_greedy_tokens_and_export_writes_them(checkpoint, capsys):
    folder, hf = checkpoint
    out = _run(folder, "parquet")
    table = pd.read_parquet(out / "continuous" / "requests.parquet")
    assert table["status"].tolist() == ["finished"] * len(REQUESTS)
    for row in table.itertuples():
        prompt, n = REQUESTS[row.request_id]
        assert list(row.prompt_token_ids) == prompt
        assert list(row.output_token_ids) == _greedy(hf, prompt, n)
    assert len(set(table.loc[0, "output_token_ids"])) > 3, "a degenerate model would prove little"

    jsonl = folder / "tokens.jsonl"
    assert main(["export", "--tokens", str(out), "--out", str(jsonl)]) == 0
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [line["request_id"] for line in lines] == list(REQUESTS)
    for line, row in zip(lines, table.itertuples(), strict=True):
        assert line["prompt_token_ids"] == list(row.prompt_token_ids)
        assert line["output_token_ids"] == list(row.output_token_ids)
    assert main(["export", "--tokens", str(out)]) == 0  # by default beside the results
    assert (out / "tokens" / "continuous.jsonl").read_text() == jsonl.read_text()


def test_csv_results_hold_the_tokens_as_json_text(checkpoint):
    folder, hf = checkpoint
    table = pd.read_csv(_run(folder, "csv") / "continuous" / "requests.csv")
    assert [json.loads(t) for t in table["prompt_token_ids"]] == [p for p, _ in REQUESTS.values()]
    assert [json.loads(t) for t in table["output_token_ids"]] == [_greedy(hf, p, n) for p, n in REQUESTS.values()]
