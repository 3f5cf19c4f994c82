"""max_model_len defaults to the model's context length (issue 40): longer requests are rejected.

Before, an unset max_model_len meant no limit, so a prompt longer than the model's context
"finished"; a value above the context was accepted too.
"""

from __future__ import annotations

import copy
import json

import pytest

from experiments.config import parse_experiment, resolve_max_model_len
from experiments.runner import run_experiment
from simcore.errors import ConfigError
from simcore.hf_config import context_length, load_hf_config, model_from_hf_dict
from simcore.presets import get_model
from tests.helpers import SMALL_EXPERIMENT

# Each preset's context length and where it comes from (the model's config.json on Hugging Face).
PUBLISHED_CONTEXT = {
    "llama-3.1-8b": 131072,  # meta-llama/Llama-3.1-8B: max_position_embeddings, rope_type llama3
    "llama-3.1-70b": 131072,  # meta-llama/Llama-3.1-70B: the same
    "llama-3.2-1b": 131072,  # meta-llama/Llama-3.2-1B: max_position_embeddings, rope_type llama3
    "llama-2-7b": 4096,  # meta-llama/Llama-2-7b-hf: max_position_embeddings
    "mistral-7b": 32768,  # mistralai/Mistral-7B-v0.1: max_position_embeddings (sliding_window 4096)
    "qwen2.5-7b": 131072,  # Qwen/Qwen2.5-7B (base): max_position_embeddings
    "tiny-llama": 2048,  # made up for tests
}


@pytest.mark.parametrize(("name", "length"), PUBLISHED_CONTEXT.items())
def test_each_preset_has_its_published_context_length(name, length):
    assert context_length(get_model(name)) == length


def _llama(**extra) -> dict:  # noqa: ANN003
    return {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256, **extra}


@pytest.mark.parametrize(("extra", "length"), [
    ({}, 2048),  # transformers' LlamaConfig default max_position_embeddings
    ({"max_position_embeddings": 4096}, 4096),
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}, 16384),
    ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, 8192),
    # yarn counts from the original length (Qwen2.5-Instruct's long-context recipe).
    ({"max_position_embeddings": 32768,
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, 131072),
    ({"max_position_embeddings": 8192, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, 16384),
    # llama3 and longrope configs already state the extended length.
    ({"max_position_embeddings": 131072,
      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}}, 131072),
    ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "longrope", "factor": 32.0}}, 131072),
    # transformers 5 spelling
    ({"max_position_embeddings": 4096, "rope_parameters": {"rope_theta": 1e4, "rope_type": "linear", "factor": 2.0}},
     8192),
])
def test_context_length_follows_vllms_rule_for_a_config_json(extra, length):
    assert context_length(model_from_hf_dict(_llama(**extra))) == length


@pytest.mark.parametrize("factor", ["big", 0, -2.0, float("nan"), float("inf"), True])
def test_a_bad_rope_scaling_factor_is_an_error_naming_the_file(tmp_path, factor):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_llama(rope_scaling={"rope_type": "linear", "factor": factor})))
    with pytest.raises(ConfigError, match=r"config.json: rope_scaling.factor: .*expected a finite positive number"):
        load_hf_config(path)


def _experiment(model: str, prompt_len: int, output_len: int, **policy) -> dict:  # noqa: ANN003
    data = copy.deepcopy(SMALL_EXPERIMENT)
    data["model"] = model
    data["kv_cache"] = {"block_size": 16, "num_blocks": 4096}
    data["workload"] = {"num_requests": 2, "arrivals": {"kind": "poisson", "rate": 8.0},
                        "prompt_len": {"kind": "fixed", "value": prompt_len},
                        "output_len": {"kind": "fixed", "value": output_len}}
    data["policies"] = [{"name": "continuous", "max_num_batched_tokens": 8192, **policy}]
    return data


def _run(data: dict):  # noqa: ANN202
    return run_experiment(parse_experiment(data, source="exp.yaml"), source="exp.yaml")


def test_a_request_longer_than_the_models_context_is_rejected_by_default():
    """Was: llama-2-7b (4096 positions) "finished" a 4000 + 200 token request."""
    run = _run(_experiment("llama-2-7b", 4000, 200))
    (policy,) = run.runs
    assert policy.summary["completed"] == 0 and policy.summary["num_rejected"] == 2
    reasons = set(policy.requests["reject_reason"])
    assert reasons == {"prompt + output = 4200 tokens exceeds max_model_len 4096"}
    assert run.info["model_context_length"] == 4096


def test_a_request_within_the_context_still_finishes():
    (policy,) = _run(_experiment("llama-2-7b", 3800, 296)).runs
    assert policy.summary["completed"] == 2 and policy.summary["num_rejected"] == 0


def test_a_max_model_len_above_the_models_context_is_an_error():
    """Was accepted: positions past 4096 are ones Llama-2 was never trained on (vLLM refuses too)."""
    with pytest.raises(ConfigError, match=r"exp.yaml: policies\[0\].max_model_len: longer than the context of "
                                          r"model 'llama-2-7b' \(4096 tokens.*expected at most 4096, found 8192"):
        _run(_experiment("llama-2-7b", 100, 10, max_model_len=8192))


def test_a_smaller_max_model_len_is_kept():
    (policy,) = _run(_experiment("llama-3.1-8b", 300, 10, max_model_len=200)).runs
    assert policy.summary["num_rejected"] == 2
    assert resolve_max_model_len(200, get_model("llama-3.1-8b"), where="w", source=None) == 200
    assert resolve_max_model_len(None, get_model("llama-3.1-8b"), where="w", source=None) == 131072
