"""Attention data parallel with expert parallelism ("DEP"): hand-worked memory, KV and step
terms for Mixtral-8x7B and DeepSeek-V3 over 4 and 8 GPUs."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from backends.roofline import RooflineCostModel
from experiments.cli import main
from simcore.capacity import DEFAULT_ACTIVATION_RESERVE_BYTES, block_bytes, num_gpu_blocks, weight_bytes_per_gpu
from simcore.plan import Decodes, Repeat, StepPlan
from simcore.presets import get_hardware, get_model
from simcore.pricing import repeat_times
from tests.helpers import SMALL_EXPERIMENT

# Mixtral-8x7B: 32 layers, hidden 4096, 8 experts of 3 x 4096 x 14336, top 2, 8 KV heads of 128.
MIXTRAL_EXPERT_PARAMS = 32 * 8 * 3 * 4096 * 14336
assert MIXTRAL_EXPERT_PARAMS == 45_097_156_608


def test_weights_per_gpu_split_only_the_experts():
    model = get_model("mixtral-8x7b")
    assert model.routed_expert_params == MIXTRAL_EXPERT_PARAMS
    rest = model.num_params - MIXTRAL_EXPERT_PARAMS
    assert weight_bytes_per_gpu(model, 2, 4) == model.num_params * 2 / 4
    assert weight_bytes_per_gpu(model, 2, 4, attention_data_parallel=True) == rest * 2 + MIXTRAL_EXPERT_PARAMS * 2 / 4
    # Experts stored apart (0.53125 bytes: MXFP4) split alone too.
    assert weight_bytes_per_gpu(model, 2, 4, 0.53125, attention_data_parallel=True) == pytest.approx(
        rest * 2 + MIXTRAL_EXPERT_PARAMS * 0.53125 / 4)


def test_blocks_hold_every_head_and_each_gpu_has_its_own():
    model, hardware = get_model("mixtral-8x7b"), get_hardware("h100-sxm")
    # 32 layers x (K and V) x 8 heads x 128 x 2 bytes x 16 positions, whole on one GPU.
    assert block_bytes(model, 16, 2, 4, attention_data_parallel=True) == 32 * 2 * 8 * 128 * 2 * 16 == 2_097_152
    assert block_bytes(model, 16, 2, 4) == 2_097_152 // 4
    free = hardware.memory_bytes * 0.9 - weight_bytes_per_gpu(model, 2, 4, attention_data_parallel=True) \
        - DEFAULT_ACTIVATION_RESERVE_BYTES
    blocks = num_gpu_blocks(model, hardware, block_size=16, kv_dtype_bytes=2, weight_dtype_bytes=2,
                            gpu_memory_utilization=0.9, tensor_parallel=4, attention_data_parallel=True)
    assert blocks == 4 * math.floor(free / 2_097_152)


def _roofline(model: str, tp: int, dp: bool, **params) -> RooflineCostModel:
    return RooflineCostModel(model=get_model(model), hardware=get_hardware("h100-sxm"), tensor_parallel=tp,
                             attention_data_parallel=dp, **params)


def test_step_terms_under_data_parallel_attention():
    tp, dp = _roofline("mixtral-8x7b", 4, False), _roofline("mixtral-8x7b", 4, True)
    model = get_model("mixtral-8x7b")
    # Every GPU reads the non-expert weights whole; FLOPs and KV per batch position split over 4.
    assert dp._weight_bytes_no_head == model.params_read_per_step(0, with_lm_head=False) * 2
    assert dp._weight_bytes_no_head == pytest.approx(4 * tp._weight_bytes_no_head)
    assert dp._gemm_flops_per_token == tp._gemm_flops_per_token
    assert dp._kv_bytes_per_pos == 32 * 2 * 8 * 128 * 2 / 4 == tp._kv_bytes_per_pos
    # No all-reduce: an all-to-all each way per MoE layer, of each token's 2 expert copies, 3/4
    # of them to another GPU, a GPU's quarter of the batch at a time, over NVLink 4 (450 GB/s, 0.6 us a hop).
    bandwidth, hop = dp._collective_link()
    assert dp._comm_per_token == pytest.approx(2 * 32 * 2 * 4096 * 2 * 0.75 / 4 / bandwidth)
    assert dp._comm_fixed == pytest.approx(2 * 32 * (6.6e-6 + hop))
    plan = StepPlan(0, decodes=Decodes(list(range(64)), [1000] * 64, [500] * 64))
    assert dp.breakdown(plan)["comm_s"] == pytest.approx(64 * dp._comm_per_token + dp._comm_fixed)


def test_mla_latent_splits_by_request_not_by_head():
    # DeepSeek-V3's latent (512 + 64 per position per layer) is whole on every tensor-parallel
    # rank; under attention data parallelism each GPU keeps only its own requests' latents.
    tp, dp = _roofline("deepseek-v3", 8, False), _roofline("deepseek-v3", 8, True)
    assert tp._kv_bytes_per_pos == 61 * 576 * 2
    assert dp._kv_bytes_per_pos == 61 * 576 * 2 / 8


def test_dense_model_and_one_gpu():
    # A dense model under data-parallel attention: replicated weights, no collective at all.
    dp = _roofline("llama-3.1-8b", 2, True)
    assert dp._comm_per_token == 0.0 and dp._comm_fixed == 0.0
    # Over one GPU it is the plain single-GPU model.
    one, plain = _roofline("mixtral-8x7b", 1, True), _roofline("mixtral-8x7b", 1, False)
    plan = StepPlan(0, decodes=Decodes([0, 1], [300, 700], [200, 200]))
    assert one.step_time(plan) == plain.step_time(plan)


def test_repeats_priced_as_steps():
    dp = _roofline("mixtral-8x7b", 4, True)
    plan = StepPlan(0, decodes=Decodes(list(range(40)), list(range(100, 140)), [50] * 40))
    repeat = Repeat(plan, 20)
    assert list(repeat_times(dp, repeat)) == [dp.step_time(step) for step in repeat.plans()]


def _write(tmp_path, **changes) -> str:  # noqa: ANN001
    data = {**SMALL_EXPERIMENT, "model": "mixtral-8x7b", "hardware": "h100-sxm", "tensor_parallel": 4,
            "attention_data_parallel": True, "policies": [{"name": "chunked_prefill"}], **changes}
    data["kv_cache"] = {"block_size": 16}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_experiment_runs_with_data_parallel_attention(tmp_path):
    assert main(["run", _write(tmp_path), "--out", str(tmp_path / "out")]) == 0
    info = json.loads((tmp_path / "out" / "run_info.json").read_text())
    assert info["kv_block_bytes"] == 2_097_152
    assert info["kv_num_blocks"] == num_gpu_blocks(
        get_model("mixtral-8x7b"), get_hardware("h100-sxm"), block_size=16, kv_dtype_bytes=2, weight_dtype_bytes=2,
        gpu_memory_utilization=0.9, tensor_parallel=4, attention_data_parallel=True)


@pytest.mark.parametrize(("changes", "message"), [
    ({"tensor_parallel": 1}, "attention_data_parallel: spreads attention over the tensor_parallel GPUs"),
    ({"pipeline_parallel": 2}, "attention_data_parallel: not modelled with pipeline stages"),
    ({"attention_data_parallel": "sometimes"}, "attention_data_parallel"),
])
def test_bad_settings_exit_2(tmp_path, capsys, changes, message):
    assert main(["run", _write(tmp_path, **changes), "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
