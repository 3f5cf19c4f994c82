"""Roofline step costs: hand-checked arithmetic, the seed's 14 ms bound, TP, swaps, and the fast path."""

from __future__ import annotations

import dataclasses
import random

import pytest

from backends.base import CostContext
from backends.registry import build_cost_model
from backends.roofline import RooflineCostModel, make_roofline, tunable_names
from simcore.errors import ConfigError
from simcore.plan import ScheduledSeq, StepPlan
from simcore.presets import HardwareSpec, get_hardware, get_model

TINY = get_model("tiny-llama")
# Round numbers so every term can be worked out by hand.
TOY = HardwareSpec("toy", peak_flops=1e12, mem_bandwidth=1e9, memory_bytes=10**9,
                   interconnect_bandwidth=1e8, interconnect_latency_s=1e-6)


def _ideal(model=TINY, hardware=TOY, **kw) -> RooflineCostModel:
    params = dict(mfu=1.0, mbu=1.0, step_overhead_s=0.0, activation_rw_per_layer=0.0)
    params.update(kw)
    return RooflineCostModel(model, hardware, **params)


def _seq(i, q, c, selects=True, prompt=None):
    return ScheduledSeq(request_id=i, num_new_tokens=q, context_len=c, selects_token=selects,
                        prompt_len=prompt if prompt is not None else c + q)


def _plan(*seqs, **kw) -> StepPlan:
    return StepPlan(step_id=0, seqs=tuple(seqs), **kw)


def _decode_plan(contexts, step_id=0) -> StepPlan:
    return StepPlan(step_id, tuple(_seq(i, 1, c, True, prompt=1) for i, c in enumerate(contexts)))


# A 4-token prefill (both select) beside one decode on 10 cached positions.
MIXED = _plan(_seq(0, 4, 0), _seq(1, 1, 10, prompt=3))


def test_hand_computed_memory_bound_step():
    # tiny-llama: L=2, h=64, H_Q=4, H_KV=2, d=16, I=128, V=256.
    # linear params per layer: q 64*64 + k,v 2*64*32 + o 64*64 + MLP 3*64*128 = 36,864.
    # dense FLOPs: 2*T*L*36864 + 2*S*V*h = 2*5*2*36864 + 2*2*256*64 = 802,816.
    # weights: non-embedding 2*(36864 + 2*64) + 64 = 74,048, + lm_head 16,384, x 2 bytes = 180,864;
    # plus the embedding rows gathered: 5 * 64 * 2 = 640 -> 181,504 bytes.
    dense = max(802816 / 1e12, 181504 / 1e9)
    # attention: 4*H_Q*d*L * sum q (c + q/2) = 512 * (4*2 + 1*10.5) = 9,472 FLOPs;
    # KV bytes: (sum c + sum q) * 2*L*H_KV*d*s = 15 * 256 = 3,840.
    attention = max(9472 / 1e12, 3840 / 1e9)
    assert _ideal().step_time(MIXED) == pytest.approx(dense + attention, rel=1e-12)
    assert dense == 181504e-9 and attention == 3840e-9


def test_hand_computed_compute_bound_step_and_overheads():
    fast_memory = dataclasses.replace(TOY, mem_bandwidth=1e18)
    model = _ideal(hardware=fast_memory, mfu=0.5, step_overhead_s=1e-3, per_seq_overhead_s=1e-4)
    expected = (802816 + 9472) / (1e12 * 0.5) + 1e-3 + 2 * 1e-4
    assert model.step_time(MIXED) == pytest.approx(expected, rel=1e-9)
    parts = model.breakdown(MIXED)
    assert parts["overhead_s"] == pytest.approx(1.2e-3)
    assert sum(v for k, v in parts.items() if k != "transfer_s") == pytest.approx(model.step_time(MIXED))


def test_activation_term():
    # 24 hidden-width tensors per layer per position: 24 * L * h * 2 bytes * T extra bytes.
    base, with_act = _ideal(), _ideal(activation_rw_per_layer=24.0)
    extra = with_act.breakdown(MIXED)["dense_s"] - base.breakdown(MIXED)["dense_s"]
    assert extra == pytest.approx(24 * 2 * 64 * 2 * 5 / 1e9)


def test_lm_head_only_for_selecting_positions():
    model = _ideal()
    chunk = _plan(_seq(0, 4, 0, selects=False, prompt=8))
    last = _plan(_seq(0, 4, 4, selects=True, prompt=8))
    # lm_head weights (256*64*2 bytes) are read only when some sequence selects.
    diff = model.breakdown(last)["dense_s"] - model.breakdown(chunk)["dense_s"]
    assert diff == pytest.approx(256 * 64 * 2 / 1e9)


def test_monotone_in_context():
    model = RooflineCostModel(get_model("llama-3.1-8b"), get_hardware("h100-sxm"))
    times = [model.step_time(_decode_plan([c] * 16)) for c in (0, 100, 1000, 10000, 100000)]
    assert times == sorted(times) and times[0] < times[-1]
    prefill = [model.step_time(_plan(_seq(0, 512, c))) for c in (0, 4096, 32768)]
    assert prefill == sorted(prefill) and prefill[0] < prefill[-1]


def test_gqa_reads_fewer_kv_bytes_than_mha():
    gqa = get_model("llama-3.1-8b")
    mha = dataclasses.replace(gqa, num_kv_heads=gqa.num_q_heads)
    hw = get_hardware("h200")
    plan = _decode_plan([32768] * 8)
    t_gqa = RooflineCostModel(gqa, hw).breakdown(plan)["attention_s"]
    t_mha = RooflineCostModel(mha, hw).breakdown(plan)["attention_s"]
    # Decode attention is memory-bound, so the time scales with H_KV: 32 / 8 = 4x.
    assert t_mha == pytest.approx(4 * t_gqa)


def test_weights_read_once_per_step_seed_14ms():
    # Seed 21.2: ~7e9 bf16 weights at 1e12 bytes/s -> at least ~14 ms per batch-1 decode step.
    device = HardwareSpec("one-tb", peak_flops=1e15, mem_bandwidth=1e12, memory_bytes=10**11,
                          interconnect_bandwidth=1e11, interconnect_latency_s=0.0)
    model = _ideal(model=get_model("llama-2-7b"), hardware=device)
    one = model.step_time(_decode_plan([16]))
    assert 0.0130 < one < 0.0145
    # Every weight but the embedding table (only the used rows are gathered) is read once.
    llama2 = get_model("llama-2-7b")
    assert one == pytest.approx((llama2.num_params - llama2.vocab_size * llama2.hidden_size) * 2 / 1e12, rel=1e-3)
    # Eight sequences share one weight read: the step costs almost the same.
    eight = model.step_time(_decode_plan([16] * 8))
    assert one < eight < 1.01 * one


def test_tensor_parallel_splits_work_and_adds_all_reduce():
    one, two = _ideal(), _ideal(tensor_parallel=2)
    p1, p2 = one.breakdown(MIXED), two.breakdown(MIXED)
    assert p2["dense_s"] == pytest.approx(p1["dense_s"] / 2)
    assert p2["attention_s"] == pytest.approx(p1["attention_s"] / 2)
    # 2 all-reduces per layer x L=2, ring factor 2(tp-1)/tp = 1, T*h*2 bytes = 640, at 1e8 B/s, + 2(tp-1) = 2
    # ring hops of 1 us each, + NCCL's 6.6 us base latency.
    assert p1["comm_s"] == 0.0
    assert p2["comm_s"] == pytest.approx(4 * (640 / 1e8 + 2e-6 + 6.6e-6))
    assert two.step_time(MIXED) == pytest.approx(sum(v for v in p2.values()))


def test_transfers_serial_and_overlap():
    swap = dict(blocks_to_swap_in=((0, 1), (2, 3), (4, 5)), blocks_to_swap_out=((6, 7),), block_bytes=10**6)
    plan = _plan(*MIXED.seqs, **swap)
    # 1 GB/s and 1 ms per copy direction: (1 ms + 3 ms) in + (1 ms + 1 ms) out = 6 ms.
    serial = _ideal(link_gbps=1.0, transfer_latency_s=1e-3)
    overlap = _ideal(link_gbps=1.0, transfer_latency_s=1e-3, transfer_mode="overlap")
    compute = serial.step_time(MIXED)
    assert serial.transfer_time(plan) == pytest.approx(6e-3)
    assert serial.step_time(plan) == pytest.approx(compute + 6e-3)
    assert overlap.step_time(plan) == pytest.approx(max(compute, 6e-3))
    # A swap-only step runs no forward pass.
    assert serial.step_time(_plan(**swap)) == pytest.approx(6e-3)
    assert serial.step_time(_plan()) == 0.0


def test_link_presets_and_defaults():
    plan = _plan(blocks_to_swap_in=((0, 1),), block_bytes=55 * 10**6)
    h200 = RooflineCostModel(TINY, get_hardware("h200"))  # host link defaults to h200-host-pinned
    assert h200.step_time(plan) == pytest.approx(1e-3 + 10e-6)
    pageable = RooflineCostModel(TINY, get_hardware("h200"), link="h200-host-pageable")
    assert pageable.step_time(plan) == pytest.approx(55e6 / 21e9 + 10e-6)


def _context(**kw) -> CostContext:
    return CostContext(model=TINY, hardware_name="h200", **kw)


def test_factory_uses_context_and_params():
    model = make_roofline({"mfu": 0.5, "step_overhead_s": 0.0, "transfer_mode": "overlap"},
                          _context(tensor_parallel=2, kv_dtype_bytes=1))
    assert (model.mfu, model.tensor_parallel, model.kv_dtype_bytes) == (0.5, 2, 1)
    assert model.hardware == get_hardware("h200")
    via_registry = build_cost_model("roofline", {"mfu": 0.5, "step_overhead_s": 0.0, "transfer_mode": "overlap"},
                                    _context(tensor_parallel=2, kv_dtype_bytes=1))
    assert via_registry.step_time(MIXED) == model.step_time(MIXED)
    assert "model" not in tunable_names() and "mfu" in tunable_names()


@pytest.mark.parametrize(
    ("params", "needle"),
    [({"mfuu": 0.5}, "did you mean 'mfu'"), ({"model": "x"}, "unknown roofline parameter"),
     ({"mfu": 1.5}, "mfu"), ({"mbu": "fast"}, "mbu"), ({"transfer_mode": "paralel"}, "transfer_mode"),
     ({"link": "pcie-gen4-pined"}, "did you mean 'pcie-gen4-pinned'"),
     ({"link": "pcie-gen4", "link_gbps": 10}, "not both"), ({"step_overhead_s": -1}, "step_overhead_s")],
)
def test_factory_errors_name_the_file_and_field(tmp_path, params, needle):
    source = tmp_path / "exp.yaml"
    with pytest.raises(ConfigError) as err:
        make_roofline(params, _context(source=source))
    assert str(source) in str(err.value) and needle in str(err.value)


def test_factory_unknown_hardware():
    with pytest.raises(ConfigError, match="did you mean 'h200'"):
        make_roofline({}, CostContext(model=TINY, hardware_name="h200x"))


# --- a run's prices equal step_time's on each of its steps, bit for bit --------------------------

MODELS = [
    RooflineCostModel(get_model("llama-3.1-8b"), get_hardware("h100-sxm")),
    RooflineCostModel(get_model("llama-3.1-70b"), get_hardware("h200"), tensor_parallel=4, mfu=0.37, mbu=0.71,
                      step_overhead_s=3.3e-4, per_seq_overhead_s=7e-6),
    RooflineCostModel(get_model("llama-3.2-1b"), get_hardware("l4"), kv_dtype_bytes=1, tensor_parallel=16),
    RooflineCostModel(TINY, get_hardware("cpu"), activation_rw_per_layer=3.3),
    _ideal(),
    RooflineCostModel(get_model("llama-3.1-8b"), get_hardware("h200"), cuda_graph_batch_sizes=[1, 2, 4, 8, 16, 32]),
]


@pytest.mark.parametrize("model_index", range(len(MODELS)))
def test_runs_price_as_their_steps(model_index):
    """On the configurations above (tensor parallel, fp8 KV, a CPU, ideal efficiencies): the
    check tests/test_cost_models.py makes for the default roofline."""
    from tests.test_cost_models import random_repeats

    model = MODELS[model_index]
    rng = random.Random(model_index)
    for _ in range(150):
        repeats = random_repeats(rng)
        assert [float(t) for r in repeats for t in model.repeat_times(r)] == \
            [model.step_time(p) for r in repeats for p in r.plans()]


# --- CUDA graphs with padding (TensorRT-LLM's cuda_graph_config enable_padding) --------------------

GRAPH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048]


def test_cuda_graph_padding_prices_a_decode_step_at_the_next_captured_batch():
    """A decode-only step of n sequences runs its GEMMs (and lm_head) as the next captured batch
    size; its attention stays the real sequences'; without sizes nothing changes."""
    plain = RooflineCostModel(get_model("llama-3.1-8b"), get_hardware("h200"))
    graphs = dataclasses.replace(plain, cuda_graph_batch_sizes=GRAPH_SIZES)
    real = _decode_plan([1500] * 518)
    padded = _decode_plan([1500] * 1024)
    assert graphs.breakdown(real)["dense_s"] == plain.breakdown(padded)["dense_s"]
    assert graphs.breakdown(real)["attention_s"] == plain.breakdown(real)["attention_s"]
    assert graphs.step_time(real) > plain.step_time(real)
    exact = _decode_plan([1500] * 512)  # a captured size: no padding
    assert graphs.step_time(exact) == plain.step_time(exact)
    over = _decode_plan([10] * 3000)  # above the largest size: eager, unpadded
    assert graphs.step_time(over) == plain.step_time(over)


def test_cuda_graph_padding_leaves_steps_with_a_prompt_piece_eager():
    plain = RooflineCostModel(get_model("llama-3.1-8b"), get_hardware("h200"))
    graphs = dataclasses.replace(plain, cuda_graph_batch_sizes=GRAPH_SIZES)
    mixed = _plan(_seq(0, 100, 0), *(_seq(i, 1, 50, prompt=10) for i in range(1, 600)))
    assert graphs.step_time(mixed) == plain.step_time(mixed)


def test_cuda_graph_padding_is_per_gpu_under_attention_data_parallelism():
    """Under attention data parallelism each GPU pads its own share of the batch."""
    model = get_model("gpt-oss-120b")
    graphs = RooflineCostModel(model, get_hardware("h100-sxm"), tensor_parallel=4, attention_data_parallel=True,
                               expert_weight_dtype_bytes=0.53125, cuda_graph_batch_sizes=GRAPH_SIZES)
    plain = dataclasses.replace(graphs, cuda_graph_batch_sizes=None)
    assert graphs.graph_rows(1100, 1100, 0) == 4 * 384  # 275 a GPU -> 384
    assert graphs.breakdown(_decode_plan([100] * 1100))["dense_s"] == \
        plain.breakdown(_decode_plan([100] * 1536))["dense_s"]


@pytest.mark.parametrize("sizes", ["64", [0, 8], [1.5], [True]])
def test_cuda_graph_batch_sizes_checked(sizes):
    with pytest.raises(ConfigError, match="cuda_graph_batch_sizes"):
        make_roofline({"cuda_graph_batch_sizes": sizes}, _context())
