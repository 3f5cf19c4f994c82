"""Prompt content for the real engine from keyed segments: equal keys give equal tokens, so a
prefix the simulator's cache shares between requests holds what either request would compute."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from backends.torch.tokens import segment_tokens, synthetic_prompt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_equal_keys_give_equal_tokens_and_uncovered_positions_keep_the_request_stream():
    a = synthetic_prompt(0, 1, 40, (("pfx:0", 32), ("req:1", 8)), 256)
    b = synthetic_prompt(0, 2, 44, (("pfx:0", 32), ("req:2", 12)), 256)
    assert (a[:32] == b[:32]).all()
    assert (a[32:] != b[32:40]).any()
    # Segments longer than the prompt are cut; positions past the segments use (seed, request_id, p).
    c = synthetic_prompt(0, 3, 20, (("pfx:0", 32),), 256)
    assert (c == a[:20]).all()
    d = synthetic_prompt(0, 4, 40, (("pfx:0", 16),), 256)
    plain = synthetic_prompt(0, 4, 40, None, 256)
    assert (d[:16] == a[:16]).all() and (d[16:] == plain[16:]).all()
    assert (plain == np.random.default_rng([0, 4]).integers(0, 256, size=40, dtype=np.int64)).all()
    # Another seed, other tokens; all inside the vocabulary.
    assert (synthetic_prompt(1, 1, 40, (("pfx:0", 32),), 256)[:32] != a[:32]).any()
    assert a.min() >= 0 and a.max() < 256 and a.dtype == np.int64


def test_segment_tokens_are_stable_across_processes():
    code = ("from backends.torch.tokens import segment_tokens; "
            "print(segment_tokens(7, 'pfx:abc', 12, 1000).tolist())")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(segment_tokens(7, "pfx:abc", 12, 1000).tolist())


EXPERIMENT = """
name: shared_prefix_tokens
seed: 3
model: tiny-llama
hardware: cpu
kv_cache: {block_size: 16, num_blocks: 32, prefix_caching: CACHING}
workload:
  num_requests: 3
  arrivals: {kind: constant, rate: 50.0}
  prefix: {num_prefixes: 1, prefix_len: {kind: fixed, value: 32}}
  prompt_len: {kind: fixed, value: 9}
  output_len: {kind: fixed, value: 6}
cost_model: {name: torch, device: cpu, dtype: fp32, warmup_rounds: 0}
policies:
  - {name: continuous}
"""


def _run(tmp_path: Path, caching: bool, monkeypatch) -> tuple[dict, dict, dict]:
    runner = pytest.importorskip("experiments.runner")
    from experiments.config import load_experiment

    path = tmp_path / f"exp_{caching}.yaml"
    path.write_text(EXPERIMENT.replace("CACHING", str(caching).lower()))
    logits: dict[int, list[torch.Tensor]] = {}
    tokens: dict[int, list[int]] = {}
    from backends.registry import build_cost_model as original


    def build(name, params, ctx):
        model = original(name, params, ctx)
        model.engine.keep_logits = "selected"
        step_time = model.step_time

        def timed(plan):
            seconds = step_time(plan)
            for rid, row in model.engine.last_logits.items():
                logits.setdefault(rid, []).append(row)
            model.engine.last_logits = {}
            return seconds

        model.step_time = timed
        built.append(model)
        return model

    built: list = []
    monkeypatch.setattr(runner, "build_cost_model", build)
    run = runner.run_experiment(load_experiment(path), source=path)
    for rid in logits:
        tokens[rid] = built[0].output_token_ids(rid)
    return run.runs[0].summary, tokens, logits


def test_shared_prefix_by_segment_key_computes_the_same_with_and_without_caching(tmp_path, monkeypatch):
    off_summary, off_tokens, off_logits = _run(tmp_path, False, monkeypatch)
    on_summary, on_tokens, on_logits = _run(tmp_path, True, monkeypatch)
    assert off_summary["prefix_cache_hits"] == 0
    assert on_summary["prefix_cache_hits"] >= 2 * 32  # the later requests hit both prefix blocks
    assert on_tokens == off_tokens and len(on_tokens) == 3
    for rid, rows in off_logits.items():
        assert len(on_logits[rid]) == len(rows) == 6
        for a, b in zip(rows, on_logits[rid], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
