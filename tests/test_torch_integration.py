"""The real engine under the simulator's own policies: preemption by recompute, swap or
offload, chunked prefill and changing batch company must not change any request's tokens."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

EXPERIMENT = """
name: torch_policies
seed: 0
model: tiny-llama
hardware: cpu
kv_cache: {block_size: 16, num_blocks: 40, host_memory_gib: 0.001, prefix_caching: false}
workload:
  num_requests: 24
  arrivals: {kind: poisson, rate: 400.0}
  prompt_len: {kind: lognormal, median: 60, sigma: 0.6, min: 8, max: 160}
  output_len: {kind: lognormal, median: 24, sigma: 0.5, min: 1, max: 80}
cost_model: {name: torch, device: cpu, record_tokens: true, warmup_rounds: 0}
policies:
  - {name: chunked_prefill, label: recompute, preemption: recompute, chunk_size: 48, max_num_batched_tokens: 96, max_num_seqs: 12}
  - {name: chunked_prefill, label: swap, preemption: swap, chunk_size: 48, max_num_batched_tokens: 96, max_num_seqs: 12}
  - {name: offload, label: offload, base: chunked_prefill, chunk_size: 48, max_num_batched_tokens: 96, max_num_seqs: 12}
"""


def test_policies_preempting_differently_produce_identical_tokens(tmp_path, monkeypatch):
    runner = pytest.importorskip("experiments.runner")
    from experiments.config import load_experiment

    path = tmp_path / "exp.yaml"
    path.write_text(EXPERIMENT)
    built = []
    original = runner.build_cost_model

    def keep(name, params, ctx):
        model = original(name, params, ctx)
        built.append(model)
        return model

    monkeypatch.setattr(runner, "build_cost_model", keep)
    run = runner.run_experiment(load_experiment(path), source=path)
    outputs = []
    for model in built:
        tokens: dict[int, list[int]] = {}
        for _, rid, token in model.token_log:
            tokens.setdefault(rid, []).append(token)
        outputs.append(tokens)
    preemptions = sum(r.summary.get("num_preemptions_recompute", 0) + r.summary.get("num_preemptions_swap", 0)
                      for r in run.runs)
    assert preemptions > 0, "the workload should force preemptions"
    assert len(outputs[0]) == 24
    for other in outputs[1:]:
        assert other == outputs[0]
