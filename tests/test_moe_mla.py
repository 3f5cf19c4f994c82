"""Mixture-of-experts, multi-head latent attention and gpt-oss's sliding layers and sinks
(issue 38 item 5): geometry from config.json, parameter counts against the model cards, KV
bytes per token per layer worked by hand, expected experts per step, roofline pricing, and
clear errors for bad files.

Model-card figures (tolerances below are the cards' own rounding):
  Mixtral 8x7B (Mistral AI, "Mixtral of experts", 2024): 46.7B total, 12.9B active.
  Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B card): 30.5B total, 3.3B activated, 29.9B non-embedding.
  DeepSeek-V3 (technical report, arXiv 2412.19437): 671B total, 37B activated per token (the
    multi-token-prediction module's 14B not included).
  gpt-oss (OpenAI gpt-oss model card, table 1): 120b 116.83B total, 5.13B active; 20b 20.91B
    total, 3.61B active; the card's active count leaves out the embedding table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from backends.roofline import RooflineCostModel
from backends.torch.support import check_engine_supports
from experiments.commands import kv_size
from simcore.capacity import block_bytes
from simcore.errors import ConfigError
from simcore.hf_config import context_length, load_hf_config
from simcore.plan import ScheduledSeq, StepPlan
from simcore.presets import get_hardware, get_model

ROOT = Path(__file__).resolve().parent.parent

# The models' config.json files, keys as published (only those the loader reads, plus a few it ignores).
CONFIGS = {
    "mixtral-8x7b": {  # mistralai/Mixtral-8x7B-v0.1
        "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "num_attention_heads": 32, "num_experts_per_tok": 2,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": None,
        "tie_word_embeddings": False, "vocab_size": 32000, "hidden_act": "silu", "model_type": "mixtral",
    },
    "qwen3-30b-a3b": {  # Qwen/Qwen3-30B-A3B
        "architectures": ["Qwen3MoeForCausalLM"], "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
        "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
        "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
        "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
        "sliding_window": None, "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936,
    },
    "deepseek-v3": {  # deepseek-ai/DeepSeek-V3
        "architectures": ["DeepseekV3ForCausalLM"], "first_k_dense_replace": 3, "hidden_act": "silu",
        "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
        "model_type": "deepseek_v3", "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
        "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
        "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                                "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                                "type": "yarn"},
        "rope_theta": 10000, "tie_word_embeddings": False, "topk_group": 4, "v_head_dim": 128, "vocab_size": 129280,
    },
}
_GPT_OSS = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "intermediate_size": 2880, "max_position_embeddings": 131072, "model_type": "gpt_oss",
    "num_attention_heads": 64, "num_experts_per_tok": 4, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False,
    "vocab_size": 201088,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
}
CONFIGS["gpt-oss-20b"] = {**_GPT_OSS, "num_hidden_layers": 24, "num_local_experts": 32,  # openai/gpt-oss-20b
                          "layer_types": ["sliding_attention", "full_attention"] * 12}
CONFIGS["gpt-oss-120b"] = {**_GPT_OSS, "num_hidden_layers": 36, "num_local_experts": 128,  # openai/gpt-oss-120b
                           "layer_types": ["sliding_attention", "full_attention"] * 18}

NEW_MODELS = sorted(CONFIGS)


def _write(folder: Path, raw: dict) -> Path:
    path = folder / "config.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize("name", NEW_MODELS)
def test_config_json_gives_the_preset(tmp_path, name):
    parsed = load_hf_config(_write(tmp_path, CONFIGS[name]))
    assert dataclasses.replace(parsed, name=name) == get_model(name)
    assert parsed.rope_scaling == get_model(name).rope_scaling


@pytest.mark.parametrize(("name", "total", "total_tol", "active", "active_tol"), [
    ("mixtral-8x7b", 46.7e9, 0.05e9, 12.9e9, 0.05e9),
    ("qwen3-30b-a3b", 30.5e9, 0.05e9, 3.3e9, 0.06e9),  # 3.35B by this count: the card rounds down
    ("deepseek-v3", 671e9, 0.5e9, 37e9, 0.6e9),  # 37.55B with both embedding tables, 36.6B without
])
def test_total_and_active_parameters_match_the_model_cards(name, total, total_tol, active, active_tol):
    model = get_model(name)
    assert abs(model.num_params - total) <= total_tol
    assert abs(model.num_active_params - active) <= active_tol


def test_qwen3_moe_non_embedding_parameters_match_the_card():
    model = get_model("qwen3-30b-a3b")
    embeddings = 2 * model.vocab_size * model.hidden_size  # untied: embed_tokens and lm_head
    assert abs(model.num_params - embeddings - 29.9e9) <= 0.05e9


@pytest.mark.parametrize(("name", "total", "active"), [("gpt-oss-120b", 116.83e9, 5.13e9),
                                                      ("gpt-oss-20b", 20.91e9, 3.61e9)])
def test_gpt_oss_parameters_match_the_model_card_table(name, total, active):
    model = get_model(name)
    embedding_table = model.vocab_size * model.hidden_size  # the card's active count leaves it out
    assert abs(model.num_params - total) <= 0.005e9
    assert abs(model.num_active_params - embedding_table - active) <= 0.005e9


def test_hand_worked_parameter_counts():
    # Mixtral: attention per layer 4096 x (4096 + 2 x 1024 + 4096) = 41,943,040; one expert
    # 3 x 4096 x 14336 = 176,160,768; router 4096 x 8; norms 2 x 4096; embeddings 2 x 32000 x 4096.
    mixtral = get_model("mixtral-8x7b")
    per_layer = 41_943_040 + 8 * 176_160_768 + 4096 * 8 + 2 * 4096
    assert mixtral.num_params == 32 * per_layer + 2 * 32000 * 4096 + 4096 == 46_702_792_704
    assert mixtral.num_active_params == 46_702_792_704 - 32 * 6 * 176_160_768
    # DeepSeek-V3 MLA per layer: q_a 7168 x 1536, q_b 1536 x 128 x 192, kv_a 7168 x (512 + 64),
    # kv_b 512 x 128 x (128 + 128), o 128 x 128 x 7168, and the two latent norms 1536 + 512.
    mla = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    deepseek = get_model("deepseek-v3")
    assert deepseek.attention_linear_params_per_layer() == mla == 187_105_280
    expert = 3 * 7168 * 2048
    moe_layer = 257 * expert + 7168 * 256  # 256 routed + 1 shared, and the router
    dense_layer = 3 * 7168 * 18432
    total = 61 * (mla + 1536 + 512 + 2 * 7168) + 3 * dense_layer + 58 * moe_layer + 2 * 129280 * 7168 + 7168
    assert deepseek.num_params == total
    assert deepseek.active_linear_params_per_token == 61 * mla + 3 * dense_layer + 58 * (9 * expert + 7168 * 256)


# --- KV bytes per token per layer, by hand ------------------------------------------------------

@pytest.mark.parametrize(("name", "per_layer_bf16", "layers"), [
    ("mixtral-8x7b", 2 * 8 * 128 * 2, 32),   # K and V, 8 KV heads of 128: 4096 bytes
    ("qwen3-30b-a3b", 2 * 4 * 128 * 2, 48),  # 4 KV heads of 128: 2048 bytes
    ("deepseek-v3", (512 + 64) * 2, 61),     # one latent, not x2, not x heads: 1152 bytes
    ("gpt-oss-20b", 2 * 8 * 64 * 2, 24),     # 8 KV heads of 64: 2048 bytes
    ("gpt-oss-120b", 2 * 8 * 64 * 2, 36),
    ("llama-3.1-8b", 2 * 8 * 128 * 2, 32),   # unchanged for a dense Llama
])
def test_kv_bytes_per_token_per_layer(name, per_layer_bf16, layers):
    model = get_model(name)
    assert model.kv_scalars_per_token_per_layer() * 2 == per_layer_bf16
    assert model.kv_bytes_per_token(2) == layers * per_layer_bf16


def test_deepseek_v3_latent_is_70272_bytes_per_token_and_whole_on_every_rank():
    model = get_model("deepseek-v3")
    assert model.kv_bytes_per_token(2) == (512 + 64) * 61 * 2 == 70_272
    # An ordinary cache of K and V for 128 heads of 192/128 would be 61 x 128 x (192 + 128) x 2 = 4,997,120.
    assert model.kv_bytes_per_token(2) < 61 * 128 * 320 * 2 / 70
    # vLLM keeps the whole latent on each tensor-parallel rank: per-GPU blocks do not shrink with tp.
    assert block_bytes(model, 16, 2, 8) == block_bytes(model, 16, 2, 1) == 70_272 * 16


def test_gpt_oss_sliding_layers_cap_kv():
    model = get_model("gpt-oss-120b")
    assert model.sliding_window == 128 and model.sliding_layers == tuple(range(0, 36, 2))
    # 18 full layers keep 4096 positions, 18 sliding layers 128, at 2 x 8 x 64 x 2 = 2048 bytes each.
    assert model.kv_bytes_needed(4096, 2) == 2048 * (18 * 4096 + 18 * 128) == 155_713_536
    assert model.kv_bytes_needed(100, 2) == 2048 * 36 * 100  # inside the window: every layer
    assert model.attention_sinks and model.num_params - dataclasses.replace(model, attention_sinks=False).num_params \
        == 36 * 64  # one sink logit per head per layer, no KV


def test_kv_size_cli_prints_mla_and_sliding_bytes(capsys):
    parser = argparse.ArgumentParser()
    kv_size.add_arguments(parser)
    assert kv_size.run(parser.parse_args(["--model", "deepseek-v3", "--tokens", "1000", "--json"])) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["bytes_per_token"] == 70_272 and result["kv_bytes"] == 70_272_000
    assert result["attention"] == "mla" and result["kv_lora_rank"] == 512 and result["kv_heads"] is None
    assert kv_size.run(parser.parse_args(["--model", "gpt-oss-20b", "--tokens", "1000", "--json"])) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["bytes_per_token"] == 24 * 2048 and result["bytes_per_token_past_window"] == 12 * 2048
    assert result["kv_bytes"] == 2048 * (12 * 1000 + 12 * 128)


# --- experts a step reads ------------------------------------------------------------------------

def test_expected_distinct_experts():
    model = get_model("mixtral-8x7b")  # E = 8, k = 2
    assert model.expected_experts_activated(1) == pytest.approx(2.0, rel=1e-15)
    assert model.expected_experts_activated(2) == pytest.approx(8 * (1 - 0.75**2)) == pytest.approx(3.5)
    assert model.expected_experts_activated(1000) == pytest.approx(8.0, rel=1e-12)
    qwen = get_model("qwen3-30b-a3b")  # E = 128, k = 8: 128 (1 - (15/16)^64) = 124.8 at T = 64
    assert qwen.expected_experts_activated(64) == pytest.approx(128 * (1 - (120 / 128) ** 64))
    assert 8 < qwen.expected_experts_activated(2) < 16
    assert get_model("llama-3.1-8b").expected_experts_activated(100) == 0.0


def _decode(batch: int, context: int = 100) -> StepPlan:
    return StepPlan(0, tuple(ScheduledSeq(i, 1, context, True, context) for i in range(batch)))


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b"])
def test_moe_decode_reads_active_weights_at_batch_1_and_all_at_large_batch(name):
    model = get_model(name)
    roofline = RooflineCostModel(model, get_hardware("h200"), mfu=1.0, mbu=1.0, step_overhead_s=0.0,
                                 activation_rw_per_layer=0.0, moe_layer_overhead_us=0.0, kernels_per_layer=0)
    embed = model.vocab_size * model.hidden_size
    dense_weights = model.num_params - (0 if model.tie_word_embeddings else embed)  # less the gathered table
    active_weights = model.num_active_params - (0 if model.tie_word_embeddings else embed)
    rate = get_hardware("h200").mem_bandwidth
    gather = model.hidden_size * 2  # the embedding row of the one position
    one = roofline.breakdown(_decode(1))["dense_s"]
    assert one == pytest.approx((active_weights * 2 + gather) / rate, rel=1e-9)
    # 4096 positions: every expert is hit (1 - k/E)^4096 ~ 0; the step is then compute bound, so
    # compare the weight reads themselves.
    assert model.params_read_per_step(4096) == pytest.approx(dense_weights, rel=1e-9)
    assert model.params_read_per_step(1) == pytest.approx(active_weights, rel=1e-12)
    many = roofline.breakdown(_decode(64))["dense_s"]
    assert one < many


def test_moe_repeat_times_match_step_times_bit_for_bit():
    from simcore.plan import Repeat

    for name in ("mixtral-8x7b", "deepseek-v3"):
        roofline = RooflineCostModel(get_model(name), get_hardware("h100-sxm"), tensor_parallel=8)
        for plan in (_decode(3), StepPlan(0, (ScheduledSeq(9, 64, 0, False, 500), *_decode(5).seqs))):
            for num_steps in (4, 40):
                repeat = Repeat(plan, num_steps, 1)
                assert [float(t) for t in roofline.repeat_times(repeat)] == \
                    [roofline.step_time(p) for p in repeat.plans()]


def test_mla_attention_prices_the_latent():
    model = get_model("deepseek-v3")
    roofline = RooflineCostModel(model, get_hardware("h200"), mfu=1.0, mbu=1.0, step_overhead_s=0.0)
    # One decode on 999 cached positions: 1000 positions x 70,272 bytes against the absorbed
    # form's 2 FLOPs x 128 heads x (2 x 512 + 64) x 61 layers x 999.5 pairs (the roofline's
    # q (c + q / 2)). Compute bound on an H200: 17.2 us against 14.6 us of latent reads.
    attention = roofline.breakdown(_decode(1, 999))["attention_s"]
    h200 = get_hardware("h200")
    flops = 2 * 128 * 1088 * 61 * 999.5
    assert attention == pytest.approx(flops / h200.peak_flops, rel=1e-12)
    assert attention > 1000 * 70_272 / h200.mem_bandwidth
    assert model.attention_macs_per_pair_per_layer() == 128 * (2 * 512 + 64)


def test_tied_dense_and_window_models_keep_their_counts():
    # The new fields default to a dense Llama layer.
    llama = get_model("llama-3.1-8b")
    assert not llama.is_moe and not llama.is_mla and llama.num_active_params == llama.num_params
    assert llama.params_read_per_step(1) == llama.num_params - llama.vocab_size * llama.hidden_size
    assert llama.attention_macs_per_pair_per_layer() == 2 * 32 * 128


def test_contexts_of_the_new_presets():
    assert [context_length(get_model(n)) for n in NEW_MODELS] == [163840, 131072, 131072, 32768, 40960]


# --- the real engine refuses them ---------------------------------------------------------------

@pytest.mark.parametrize(("name", "fragment"), [("mixtral-8x7b", "mixture-of-experts"),
                                                ("deepseek-v3", "multi-head latent attention"),
                                                ("gpt-oss-20b", "attention sinks")])
def test_real_engine_refuses_by_feature(name, fragment):
    with pytest.raises(ConfigError, match=fragment) as info:
        check_engine_supports(get_model(name), source="exp.yaml")
    assert "roofline" in str(info.value) and "exp.yaml: model" in str(info.value)
    check_engine_supports(get_model("llama-3.1-8b"))  # a Llama passes


def test_torch_build_engine_refuses_moe():
    torch = pytest.importorskip("torch")
    from backends.torch.factory import build_engine

    tiny_moe = dataclasses.replace(get_model("tiny-llama"), num_experts=4, num_experts_per_tok=2)
    with pytest.raises(ConfigError, match="mixture-of-experts"):
        build_engine(tiny_moe, device=torch.device("cpu"), dtype=torch.float32, num_blocks=4, block_size=4)


# --- bad config.json: a clear error naming the field --------------------------------------------

BAD = [
    ("deepseek-v3", {"kv_lora_rank": 0}, "kv_lora_rank: invalid value"),
    ("deepseek-v3", {"qk_rope_head_dim": -64}, "qk_rope_head_dim: invalid value"),
    ("deepseek-v3", {"first_k_dense_replace": 62}, "first_k_dense_replace: more leading dense layers"),
    ("deepseek-v3", {"n_shared_experts": -1}, "n_shared_experts: invalid value"),
    ("deepseek-v3", {"num_key_value_heads": 3}, "not divisible by num_key_value_heads"),
    ("mixtral-8x7b", {"num_experts_per_tok": 9}, "num_experts_per_tok: num_experts_per_tok (9) is more than the 8"),
    ("mixtral-8x7b", {"num_local_experts": "8"}, "num_local_experts: invalid value"),
    ("mixtral-8x7b", {"num_key_value_heads": 5}, "num_key_value_heads"),
    ("qwen3-30b-a3b", {"mlp_only_layers": [48]}, "mlp_only_layers: invalid value"),
    ("qwen3-30b-a3b", {"moe_intermediate_size": 0}, "moe_intermediate_size: invalid value"),
    ("gpt-oss-20b", {"layer_types": ["sliding_attention"] * 3}, "layer_types: invalid value"),
    ("gpt-oss-20b", {"num_experts_per_tok": 33}, "num_experts_per_tok"),
]


@pytest.mark.parametrize(("name", "changes", "fragment"), BAD, ids=[f"{b[0]}-{next(iter(b[1]))}" for b in BAD])
def test_bad_config_names_the_field(tmp_path, name, changes, fragment):
    path = _write(tmp_path, {**CONFIGS[name], **changes})
    with pytest.raises(ConfigError, match=None) as info:
        load_hf_config(path)
    assert fragment in str(info.value) and "config.json" in str(info.value)


def test_deepseek_v2_lite_without_q_lora(tmp_path):
    raw = {**CONFIGS["deepseek-v3"], "architectures": ["DeepseekV2ForCausalLM"], "q_lora_rank": None,
           "first_k_dense_replace": 1, "n_shared_experts": 2, "n_routed_experts": 64, "num_experts_per_tok": 6,
           "num_hidden_layers": 27, "hidden_size": 2048, "moe_intermediate_size": 1408, "intermediate_size": 10944,
           "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 102400}
    model = load_hf_config(_write(tmp_path, raw))
    assert model.q_lora_rank == 0 and model.dense_mlp_layers == (0,) and model.kv_bytes_per_token(2) == 27 * 1152
    # DeepSeek-V2 paper (arXiv 2405.04434), V2-Lite: 15.7B total, 2.4B activated. 2.45B here without
    # the embedding table (2.66B with it), so the paper's count seems to leave the table out, as gpt-oss's does.
    assert abs(model.num_params - 15.7e9) <= 0.05e9
    assert abs(model.num_active_params - 102400 * 2048 - 2.4e9) <= 0.06e9
    del raw["kv_lora_rank"]  # V2 has no defaults assumed
    with pytest.raises(ConfigError, match="kv_lora_rank: required key is missing"):
        load_hf_config(_write(tmp_path, raw))


def test_kv_size_with_a_bad_config_exits_2(tmp_path):
    path = _write(tmp_path, {**CONFIGS["deepseek-v3"], "kv_lora_rank": 0})
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "kv-size", "--model", str(path), "--tokens", "10"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "config.json: kv_lora_rank: invalid value" in proc.stderr


# --- sliding layers in the roofline (gpt-oss) ---------------------------------------------------

def test_sliding_layers_cap_attention_in_the_roofline():
    model = get_model("gpt-oss-120b")
    h200 = get_hardware("h200")
    roofline = RooflineCostModel(model, h200, mfu=1.0, mbu=1.0, step_overhead_s=0.0)
    # One decode on 99,999 cached positions: 18 full layers read 99,999 and write 1; 18 sliding
    # layers read 128 and write 1; 2 x 8 x 64 x 2 = 2048 bytes per position per layer.
    memory = (18 * 100_000 + 18 * 129) * 2048 / h200.mem_bandwidth
    # FLOPs: 2 x 64 heads x 64 x 2 per pair; full layers 99,999.5 pairs, sliding 127.5 (2 x 128 - 1 = 255 work).
    compute = (18 * 199_999 + 18 * 255) * (2 * 64 * 64) / h200.peak_flops
    assert roofline.breakdown(_decode(1, 99_999))["attention_s"] == pytest.approx(max(memory, compute), rel=1e-12)
    # Inside the window every layer is full: the same as a model without sliding layers.
    unwindowed = RooflineCostModel(dataclasses.replace(model, sliding_window=None, sliding_layers=()), h200)
    short = _decode(4, 50)
    assert RooflineCostModel(model, h200).step_time(short) == pytest.approx(unwindowed.step_time(short), rel=1e-12)


def test_windowed_repeats_price_as_their_steps():
    """Sliding layers send repeats to step-by-step pricing; the bit-for-bit check of
    tests/test_cost_models.py still holds."""
    import random

    from tests.test_cost_models import random_repeats

    roofline = RooflineCostModel(get_model("gpt-oss-20b"), get_hardware("h100-sxm"), tensor_parallel=2)
    rng = random.Random(5)
    for _ in range(30):
        for repeat in random_repeats(rng):
            assert [float(t) for t in roofline.repeat_times(repeat)] == [roofline.step_time(p) for p in repeat.plans()]


def test_a_dense_profile_table_is_not_taken_for_its_moe_twin(tmp_path):
    """Mixtral 8x7B has Mistral 7B's every dense field; a table measured on one is refused for the other."""
    from backends.base import CostContext
    from backends.profiled import ProfileTable, check_geometry

    header = {"model": json.dumps(dataclasses.asdict(get_model("mistral-7b")), sort_keys=True)}
    table = ProfileTable(tmp_path / "t.csv", header, [])
    check_geometry(table, CostContext(model=get_model("mistral-7b"), hardware_name="h200"), None)
    with pytest.raises(ConfigError, match="num_experts: table 0, model 8"):
        check_geometry(table, CostContext(model=get_model("mixtral-8x7b"), hardware_name="h200"), None)


def test_defaults_and_alternate_spellings(tmp_path):
    # Qwen3MoeConfig has no head_dim (hidden / heads: 64 here; the real file says 128) and
    # transformers maps num_experts and num_local_experts onto one attribute for Qwen3-MoE and gpt-oss.
    raw = {k: v for k, v in CONFIGS["qwen3-30b-a3b"].items() if k not in ("head_dim", "num_experts")}
    model = load_hf_config(_write(tmp_path, {**raw, "num_local_experts": 128}))
    assert (model.head_dim, model.num_experts) == (64, 128)
    raw = {k: v for k, v in CONFIGS["gpt-oss-20b"].items() if k not in ("num_local_experts", "layer_types")}
    model = load_hf_config(_write(tmp_path, {**raw, "num_experts": 32}))
    # GptOssConfig's default layer_types: sliding on even layers.
    assert model.num_experts == 32 and model.sliding_layers == tuple(range(0, 24, 2))
    # DeepSeek-V3's class defaults are the 671B model's.
    minimal = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
               "num_hidden_layers": 61, "num_attention_heads": 128, "vocab_size": 129280}
    model = load_hf_config(_write(tmp_path, minimal))
    assert model.kv_bytes_per_token(2) == 70_272 and model.num_params == get_model("deepseek-v3").num_params
