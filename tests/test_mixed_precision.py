"""Checkpoints whose parts differ in precision, by hand: MXFP4 routed experts beside bf16 attention
(gpt-oss), NVFP4 and MXFP4 with their block scales, W4A4/W4A8 on a part with an fp4 peak, and the
bf16 residual stream and all-reduces of an fp8 or fp4 engine."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from backends.registry import build_cost_model
from backends.roofline import RooflineCostModel, moe_expert_tile_rows
from experiments.config import parse_experiment
from experiments.runner import cost_context, resolve_kv
from simcore.capacity import DEFAULT_ACTIVATION_RESERVE_BYTES, block_bytes
from simcore.errors import ConfigError
from simcore.hardware import HardwareSpec
from simcore.hf_config import load_hf_config
from simcore.plan import ScheduledSeq, StepPlan
from simcore.precision import WEIGHT_DTYPE_BYTES, default_activation_dtype
from simcore.presets import get_hardware, get_model
from tests.helpers import SMALL_EXPERIMENT
from tests.test_moe_mla import CONFIGS

ROOT = Path(__file__).resolve().parent.parent
_SPEC = importlib.util.spec_from_file_location("published_benchmark_mixed", ROOT / "benchmarks" / "published.py")
published = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(published)
# gpt-oss's expert: gate and up (2880 -> 2 x 2880) and down (2880 -> 2880), with biases on all three.
GPT_OSS_PARAMS_PER_EXPERT = 3 * 2880 * 2880 + 2 * 2880 + 2880  # 24,891,840


def _experiment(**changes) -> dict:  # noqa: ANN003
    exp = {**json.loads(json.dumps(SMALL_EXPERIMENT)), **changes}
    exp["kv_cache"] = {"block_size": 16, **changes.get("kv_cache", {})}
    exp["cost_model"] = {"name": "roofline"}
    return exp


def _roofline(**changes) -> RooflineCostModel:  # noqa: ANN003
    exp = parse_experiment(_experiment(**changes), source=None)
    kv = resolve_kv(exp, source=None)
    return build_cost_model("roofline", {}, cost_context(exp, kv, None))


# --- dtypes -------------------------------------------------------------------------------------


def test_block_scaled_fp4_counts_its_scales():
    # NVFP4: a 4-bit value plus one 8-bit scale per 16 -> 4 + 8/16 = 4.5 bits; MXFP4: one 8-bit
    # scale per 32 -> 4.25 bits.
    assert WEIGHT_DTYPE_BYTES["nvfp4"] == 4.5 / 8 == 0.5625
    assert WEIGHT_DTYPE_BYTES["mxfp4"] == 4.25 / 8 == 0.53125
    assert WEIGHT_DTYPE_BYTES["fp4"] == WEIGHT_DTYPE_BYTES["int4"] == 0.5


def test_four_bit_activations_follow_the_part():
    names = ("bf16", "fp8", "int8", "int4", "fp4", "nvfp4", "mxfp4")
    assert [default_activation_dtype(w) for w in names] == ["bf16", "fp8", "int8", "bf16", "bf16", "bf16", "bf16"]
    # A Blackwell: NVFP4 as W4A4, MXFP4 with MXFP8 activations, GPTQ/AWQ int4 still weight-only.
    assert [default_activation_dtype(w, fp4_peak=True) for w in names] == \
        ["bf16", "fp8", "int8", "bf16", "fp4", "fp4", "fp8"]


@pytest.mark.parametrize(("hardware", "peak"), [("b200", 9000e12), ("h100-sxm", 989e12), ("a100-80gb", 312e12)])
def test_an_nvfp4_checkpoint_runs_at_the_fp4_peak_only_where_there_is_one(hardware, peak):
    roofline = _roofline(hardware=hardware, weight_dtype="nvfp4")
    # (fp4 GEMMs reach 0.56 of the share of their peak that bf16 GEMMs reach: PEAK_EFFICIENCY.)
    assert roofline._gemm_compute_rate == pytest.approx(peak * roofline.mfu * (0.56 if hardware == "b200" else 1.0),
                                                        rel=1e-15)
    assert roofline.weight_dtype_bytes == 0.5625
    # activation_dtype given wins over the part's default.
    assert _roofline(hardware="b200", weight_dtype="nvfp4", activation_dtype="bf16")._gemm_compute_rate == \
        2250e12 * roofline.mfu


# --- routed experts in their own dtype ----------------------------------------------------------


def test_gpt_oss_experts_are_mxfp4_and_the_rest_bf16():
    model = get_model("gpt-oss-120b")
    assert model.expert_weight_dtype == "mxfp4"
    assert model.params_per_expert == GPT_OSS_PARAMS_PER_EXPERT
    routed = 36 * 128 * GPT_OSS_PARAMS_PER_EXPERT
    assert model.routed_expert_params == routed == 114_701_598_720
    # 114,701,598,720 x 4.25 / 8 = 60,935,224,320 bytes of experts; everything else 2 bytes.
    rest = model.num_params - routed
    assert model.weight_bytes(2, 0.53125) == rest * 2 + 60_935_224_320
    assert model.weight_bytes(2) == model.num_params * 2
    # About 64.8 GB in all (the checkpoint's files are ~65 GB), not the 117 GB of all-fp8.
    assert 64e9 < model.weight_bytes(2, 0.53125) < 66e9


def test_gpt_oss_kv_capacity_counts_mxfp4_experts():
    exp = parse_experiment(_experiment(model="gpt-oss-120b", hardware="h200", weight_dtype="bf16",
                                       kv_cache={"gpu_memory_utilization": 0.9}), source=None)
    kv = resolve_kv(exp, source=None)
    model, hw = get_model("gpt-oss-120b"), get_hardware("h200")
    usable = hw.memory_bytes * 0.9  # 143,771 MiB
    weights = model.weight_bytes(2, 0.53125)
    assert kv["num_blocks"] == math.floor((usable - weights - DEFAULT_ACTIVATION_RESERVE_BYTES)
                                          / block_bytes(model, 16, 2))
    # expert_weight_dtype overrides the checkpoint's: all bf16 does not fit in 0.9 of an H200.
    with pytest.raises(ConfigError, match="does not leave room"):
        resolve_kv(parse_experiment(_experiment(model="gpt-oss-120b", hardware="h200", expert_weight_dtype="bf16"),
                                    source=None), source=None)


def test_decode_reads_the_routed_experts_at_their_bytes():
    # gpt-oss-20b, one decode on an ideal H200 (no overheads, no activation traffic): weights
    # outside the routed experts (lm_head included) at 2 bytes, plus k = 4 experts in each of 24
    # layers, 24 x 4 x 24,891,840 = 2,389,616,640 parameters at 0.53125 = 1,269,483,840 bytes, plus
    # the embedding row gathered (2880 x 2 bytes).
    model, hw = get_model("gpt-oss-20b"), get_hardware("h200")
    roofline = RooflineCostModel(model, hw, weight_dtype_bytes=2, expert_weight_dtype_bytes=0.53125, mfu=1.0,
                                 mbu=1.0, step_overhead_s=0.0, activation_rw_per_layer=0.0, moe_layer_overhead_us=0.0,
                                 kernels_per_layer=0)
    plan = StepPlan(0, (ScheduledSeq(0, 1, 100, True, 100),))
    assert 24 * 4 * GPT_OSS_PARAMS_PER_EXPERT == 2_389_616_640
    expected = (model.params_read_per_step(0) * 2 + 1_269_483_840 + 2880 * 2) / 4.8e12
    assert roofline.breakdown(plan)["dense_s"] == pytest.approx(expected, rel=1e-12)
    # Left unset, the experts are priced at weight_dtype_bytes, as before.
    before = RooflineCostModel(model, hw, mfu=1.0, mbu=1.0, step_overhead_s=0.0, activation_rw_per_layer=0.0,
                               moe_layer_overhead_us=0.0, kernels_per_layer=0)
    assert before.breakdown(plan)["dense_s"] == pytest.approx((model.params_read_per_step(1) * 2 + 2880 * 2) / 4.8e12,
                                                             rel=1e-12)


def test_config_json_reads_mxfp4_experts_and_ignores_whole_model_quantization(tmp_path):
    path = tmp_path / "config.json"
    for quant, expected in (({"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}, "mxfp4"),
                            ({"quant_method": "fp8", "weight_block_size": [128, 128]}, None), (None, None)):
        raw = {k: v for k, v in CONFIGS["gpt-oss-20b"].items() if k != "quantization_config"}
        if quant is not None:
            raw["quantization_config"] = quant
        path.write_text(json.dumps(raw))
        assert load_hf_config(path).expert_weight_dtype == expected


def test_expert_weight_dtype_on_a_dense_model_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="expert_weight_dtype"):
        resolve_kv(parse_experiment(_experiment(expert_weight_dtype="mxfp4"), source=None), source=None)
    with pytest.raises(ConfigError, match="expert_weight_dtype"):
        parse_experiment(_experiment(model="gpt-oss-20b", expert_weight_dtype="fp3"), source="exp.yaml")
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(_experiment(expert_weight_dtype="mxfp4")))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "experiments.cli", "run", str(path), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "expert_weight_dtype" in done.stderr


# --- the activations between GEMMs stay bf16 ----------------------------------------------------


TINY = get_model("tiny-llama")  # L=2, h=64
TOY = HardwareSpec("toy", peak_flops=1e12, mem_bandwidth=1e9, memory_bytes=10**9, interconnect_bandwidth=1e8,
                   interconnect_latency_s=1e-6, peak_flops_fp8=2e12)
# A 4-token prefill beside one decode: T = 5 positions.
MIXED = StepPlan(step_id=0, seqs=(ScheduledSeq(0, 4, 0, True, 4), ScheduledSeq(1, 1, 10, True, 3)))


def _ideal(**kw) -> RooflineCostModel:  # noqa: ANN003
    return RooflineCostModel(TINY, TOY, **{"mfu": 1.0, "mbu": 1.0, "step_overhead_s": 0.0, **kw})


def test_fp8_all_reduces_carry_bf16():
    # 2 all-reduces x 2 layers, each 6.6 us base + 2 hops of 1 us + (2 (tp-1)/tp = 1) x T h 2 bytes
    # = 5 x 64 x 2 = 640 bytes over 1e8 bytes/s: the same as bf16, though the GEMMs run at fp8.
    fp8 = _ideal(tensor_parallel=2, activation_dtype="fp8", weight_dtype_bytes=1)
    assert fp8.breakdown(MIXED)["comm_s"] == pytest.approx(4 * (6.6e-6 + 2e-6 + 640 / 1e8), rel=1e-12)
    assert fp8._gemm_compute_rate == 2e12 * 0.75  # (fp8 GEMMs: 0.75 of bf16's share of peak)
    # The old rule (activations of the GEMM's dtype, 1 byte) is activation_stream_bytes: 1.
    old = _ideal(tensor_parallel=2, activation_dtype="fp8", weight_dtype_bytes=1, activation_stream_bytes=1)
    assert old.breakdown(MIXED)["comm_s"] == pytest.approx(4 * (6.6e-6 + 2e-6 + 320 / 1e8), rel=1e-12)
    # Activation traffic: 24 hidden-width tensors a layer x 2 layers x 64 x 2 bytes, plus the
    # gathered embedding row (64 x 2), per position, split over tp = 2.
    assert fp8._act_bytes_per_token == (24 * 2 * 64 * 2 + 64 * 2) / 2
    assert _ideal(activation_dtype="fp32")._act_bytes_per_token == 24 * 2 * 64 * 4 + 64 * 4
    with pytest.raises(ValueError, match="activation_stream_bytes"):
        _ideal(activation_stream_bytes=0)


# --- published.py: prompts whole (TensorRT-LLM without chunked context) -------------------------


def test_a_source_without_chunked_prefill_runs_prompts_whole():
    figures = yaml.safe_load(published.FIGURES.read_text())
    fig = next(f for f in figures["figures"] if f["source"] == "nim-benchmarking-llm-1.0-performance")
    source = figures["sources"][fig["source"]]
    assert source["engine_settings"]["chunked_prefill"] is False
    policy = published.experiment_for(fig, source, max_requests=4000, quick=False)["policies"][0]
    assert policy == {"name": "continuous", "mixed": True, "max_num_seqs": 256, "max_num_batched_tokens": 8192,
                      "admission": "reserve"}
    other = next(f for f in figures["figures"] if f["source"] == "trtllm-1.0-perf-overview")
    assert published.experiment_for(other, figures["sources"][other["source"]], max_requests=10,
                                    quick=False)["policies"][0]["name"] == "chunked_prefill"


# --- the routed experts' grouped GEMM pads each expert to whole tiles ---------------------------


def test_expected_expert_rows_by_hand():
    model = get_model("gpt-oss-120b")  # E = 128, k = 4
    assert model.expected_expert_rows(1000, 1) == 4000.0  # unpadded: T k
    assert model.expected_expert_rows(1, 16) == 64.0  # one token, 4 experts, a 16-row tile each
    assert get_model("llama-3.1-8b").expected_expert_rows(100, 16) == 0.0
    # E = 2, k = 1, T = 2, tiles of 2 rows: both tokens on one expert (probability 1/2) run one
    # tile, 2 rows; split (1/2) they run two tiles, 4 rows: 3 rows expected.
    toy = dataclasses.replace(get_model("mixtral-8x7b"), num_experts=2, num_experts_per_tok=1)
    assert toy.expected_expert_rows(2, 2) == pytest.approx(3.0, rel=1e-12)
    # k = E: every expert gets all T = 5 tokens, ceil(5 / 4) = 2 tiles of 4 each.
    every = dataclasses.replace(toy, num_experts_per_tok=2)
    assert every.expected_expert_rows(5, 4) == 2 * 4 * 2
    # Many tokens per expert: padding adds at most one tile per expert.
    rows = model.expected_expert_rows(8192, 128)
    assert 8192 * 4 < rows < 8192 * 4 + 128 * 128


@pytest.mark.parametrize(("tokens_per_expert", "tile"), [(0.25, 16), (8, 16), (12, 32), (20, 64), (64, 64),
                                                         (65, 128), (100, 128), (300, 128)])
def test_moe_tile_rows_follow_the_triton_kernels(tokens_per_expert, tile):
    # At most 64 tokens per expert: next power of two of 2t in [16, 64]; above: of t in [16, 128].
    assert moe_expert_tile_rows(tokens_per_expert) == tile


def test_expert_parallel_tile_rows_count_the_local_experts():
    # Under attention data parallelism over tp GPUs each holds E / tp experts and its Triton MoE
    # kernel picks its tile from all T k slots over those: gpt-oss-120b (E 128, k 4) at T = 768
    # has 24 tokens per expert (tile 64 on one GPU) but 96 per local expert under DEP4 (tile 128),
    # where aiconfigurator's H100 EP4 MoE table steps from 0.33 to 0.61 ms.
    model, hw = get_model("gpt-oss-120b"), get_hardware("h100-sxm")
    single = RooflineCostModel(model, hw)
    dep4 = RooflineCostModel(model, hw, tensor_parallel=4, attention_data_parallel=True)
    tp4 = RooflineCostModel(model, hw, tensor_parallel=4)
    assert single.expert_tile_rows(768) == tp4.expert_tile_rows(768) == 64
    assert dep4.expert_tile_rows(768) == 128
    assert dep4.expert_tile_rows(512) == 64  # 64 per local expert: still a tile of 64
    assert RooflineCostModel(model, hw, tensor_parallel=4, attention_data_parallel=True,
                             moe_tile_rows=16).expert_tile_rows(768) == 16


def test_padded_expert_rows_price_the_moe_gemms():
    # Mixtral, a 4096-token prefill on an ideal H200 (compute bound): t = 4096 x 2 / 8 = 1024
    # tokens per expert, tiles of 128 rows. The padded rows beyond T k each cost 2 L 3 h I FLOPs.
    model, hw = get_model("mixtral-8x7b"), get_hardware("h200")
    kw = dict(mfu=1.0, mbu=1.0, step_overhead_s=0.0, activation_rw_per_layer=0.0, moe_layer_overhead_us=0.0, kernels_per_layer=0,
              moe_gemm_efficiency=1.0)
    padded, unpadded = RooflineCostModel(model, hw, **kw), RooflineCostModel(model, hw, moe_tile_rows=1, **kw)
    plan = StepPlan(0, (ScheduledSeq(0, 4096, 0, True, 4096),))
    assert padded.expert_tile_rows(4096) == 128
    rows = model.expected_expert_rows(4096, 128)
    extra = (rows - 4096 * 2) * 2 * 32 * 3 * 4096 * 14336 / 989e12
    assert padded.breakdown(plan)["dense_s"] - unpadded.breakdown(plan)["dense_s"] == pytest.approx(extra, rel=1e-9)
    # Unpadded is the old pricing: 2 FLOPs per active linear weight per position, plus the lm_head.
    flops = 4096 * 2 * model.active_linear_params_per_token + 2 * model.vocab_size * 4096
    assert unpadded.breakdown(plan)["dense_s"] == pytest.approx(flops / 989e12, rel=1e-12)
    with pytest.raises(ValueError, match="moe_tile_rows"):
        RooflineCostModel(model, hw, moe_tile_rows=0)


# ---- kernels: narrower peaks, dequantizing MoE GEMMs, MoE layers' fixed time, KV reads ----------

def test_narrower_peaks_reach_less_of_their_peak():
    # fp8 GEMMs reach 0.75, fp4 0.56 of the share of their peak bf16 GEMMs reach of theirs
    # (aiconfigurator's H200/B200 GEMM medians); peak_efficiency: 1 for each gives mfu on every peak.
    h100, b200 = get_hardware("h100-sxm"), get_hardware("b200")
    model = get_model("llama-3.1-8b")
    fp8 = RooflineCostModel(model, h100, mfu=0.6, activation_dtype="fp8")
    assert fp8._gemm_compute_rate == pytest.approx(1979e12 * 0.6 * 0.75, rel=1e-15)
    assert fp8.gemm_peak() == pytest.approx(1979e12 * 0.75, rel=1e-15)  # what calibration fits mfu against
    fp4 = RooflineCostModel(model, b200, mfu=0.6, activation_dtype="fp4")
    assert fp4._gemm_compute_rate == pytest.approx(9000e12 * 0.6 * 0.56, rel=1e-15)
    flat = RooflineCostModel(model, b200, mfu=0.6, activation_dtype="fp4", peak_efficiency={"fp4": 1.0})
    assert flat._gemm_compute_rate == 9000e12 * 0.6
    for bad in ({"fp6": 1.0}, {"fp8": 1.5}, [0.5]):
        with pytest.raises(ValueError, match="peak_efficiency"):
            RooflineCostModel(model, h100, peak_efficiency=bad)


def test_moe_gemms_by_width_dtype_and_widening():
    # Grouped GEMMs reach I / (I + 512 x peak / bf16 peak) of the dense rate for experts of
    # intermediate size I; 0.57 of that where the kernel widens the weights.
    # gpt-oss-20b (I = 2880): MXFP4 x bf16 on an H200, widened: 2880 / 3392 x 0.57.
    model = get_model("gpt-oss-20b")
    h200 = RooflineCostModel(model, get_hardware("h200"), expert_weight_dtype_bytes=0.53125)
    assert h200._expert_compute_rate == pytest.approx(h200._gemm_compute_rate * 2880 / 3392 * 0.57, rel=1e-12)
    # On a B200 with fp8 activations (an fp4 peak: MXFP8 x MXFP4 natively), not widened; the fp8
    # peak is twice bf16's, so half the rate is at 1024.
    b200 = RooflineCostModel(model, get_hardware("b200"), expert_weight_dtype_bytes=0.53125, activation_dtype="fp8")
    assert b200._expert_compute_rate == pytest.approx(b200._gemm_compute_rate * 2880 / (2880 + 1024), rel=1e-12)
    # Qwen3-30B-A3B (I = 768) NVFP4 W4A4 on a B200: the fp4 peak is 4x bf16's: 768 / (768 + 2048).
    qwen = RooflineCostModel(get_model("qwen3-30b-a3b"), get_hardware("b200"), weight_dtype_bytes=0.5625,
                             activation_dtype="fp4")
    assert qwen._expert_compute_rate == pytest.approx(qwen._gemm_compute_rate * 768 / 2816, rel=1e-12)
    # Given, it replaces the rule; a width of 0 gives the dense rate.
    given = RooflineCostModel(model, get_hardware("h200"), expert_weight_dtype_bytes=0.53125, moe_gemm_efficiency=0.8)
    assert given._expert_compute_rate == pytest.approx(given._gemm_compute_rate * 0.8, rel=1e-15)
    wide = RooflineCostModel(model, get_hardware("h200"), moe_half_rate_width=0.0)
    assert wide._expert_compute_rate == wide._gemm_compute_rate
    with pytest.raises(ValueError, match="moe_half_rate_width"):
        RooflineCostModel(model, get_hardware("h200"), moe_half_rate_width=-1.0)


def test_each_moe_layer_adds_its_fixed_time():
    # gpt-oss-20b has 24 MoE layers: 24 x 50 us a step, on top of the experts' own bound.
    model, hw = get_model("gpt-oss-20b"), get_hardware("h200")
    plan = StepPlan(0, (ScheduledSeq(0, 1, 100, True, 100),))
    with_fixed = RooflineCostModel(model, hw).breakdown(plan)["dense_s"]
    without = RooflineCostModel(model, hw, moe_layer_overhead_us=0.0).breakdown(plan)["dense_s"]
    assert with_fixed - without == pytest.approx(24 * 50e-6, rel=1e-9)
    dense_model = get_model("llama-3.1-8b")
    assert RooflineCostModel(dense_model, hw)._moe_fixed == 0.0
    with pytest.raises(ValueError, match="moe_layer_overhead_us"):
        RooflineCostModel(model, hw, moe_layer_overhead_us=-1.0)


def test_kv_read_once_per_query_head():
    # Llama-3.1-70B, 64 query heads over 8 KV heads, on 4 GPUs: 16 query heads share 2 KV heads a
    # GPU, so a kernel reading KV once per query head moves 8 times the bytes; MLA reads its latent once.
    model, hw = get_model("llama-3.1-70b"), get_hardware("h100-sxm")
    shared = RooflineCostModel(model, hw, tensor_parallel=4)
    per_head = RooflineCostModel(model, hw, tensor_parallel=4, attention_kv_reads="per_query_head")
    assert shared._kv_bytes_per_pos == 80 * 2 * 2 * 128 * 2
    assert per_head._kv_bytes_per_pos == 8 * shared._kv_bytes_per_pos
    mla = get_model("deepseek-v3")
    assert RooflineCostModel(mla, hw, tensor_parallel=8, attention_kv_reads="per_query_head")._kv_bytes_per_pos == \
        RooflineCostModel(mla, hw, tensor_parallel=8)._kv_bytes_per_pos
    with pytest.raises(ValueError, match="attention_kv_reads"):
        RooflineCostModel(model, hw, attention_kv_reads="per_token")
