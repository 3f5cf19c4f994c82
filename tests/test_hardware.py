"""Hardware presets and their sources, hardware given as a mapping, dtype peaks and bytes, ring
all-reduce and pipeline stages by hand, and bad hardware input as one clear error."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from backends.roofline import RooflineCostModel
from experiments.cli import main
from experiments.config import parse_experiment
from experiments.runner import resolve_kv, run_experiment
from simcore.capacity import block_bytes, num_gpu_blocks
from simcore.errors import ConfigError
from simcore.hardware import DATA_FILE, HardwareSpec, hardware_from_mapping, mesh_bandwidth, raw_links, raw_presets
from simcore.plan import ScheduledSeq, StepPlan
from simcore.precision import default_activation_dtype
from simcore.presets import HARDWARE, LINKS, get_hardware, get_model
from tests.helpers import SMALL_EXPERIMENT

ROOT = Path(__file__).resolve().parent.parent
TINY = get_model("tiny-llama")  # L=2, h=64, H_KV=2
# Round numbers: 1e8 bytes/s between GPUs, 1 us per ring hop.
TOY = HardwareSpec("toy", peak_flops=1e12, mem_bandwidth=1e9, memory_bytes=10**9,
                   interconnect_bandwidth=1e8, interconnect_latency_s=1e-6)
# A 4-token prefill beside one decode: T = 5 positions.
MIXED = StepPlan(step_id=0, seqs=(
    ScheduledSeq(request_id=0, num_new_tokens=4, context_len=0, selects_token=True, prompt_len=4),
    ScheduledSeq(request_id=1, num_new_tokens=1, context_len=10, selects_token=True, prompt_len=3)))
OLD_PRESETS = ("a100-80gb", "h100-sxm", "h200", "l4", "cpu")
ISSUE_PRESETS = ("a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h20", "h200", "b200", "mi300x", "mi325x",
                 "l4", "l40s", "cpu")


def _ideal(model=TINY, hardware=TOY, **kw) -> RooflineCostModel:  # noqa: ANN001
    params = dict(mfu=1.0, mbu=1.0, step_overhead_s=0.0, activation_rw_per_layer=0.0, kernels_per_layer=0.0)
    return RooflineCostModel(model, hardware, **{**params, **kw})


# --- the data file ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(raw_presets()))
def test_each_preset_loads(name):
    hw = get_hardware(name)
    assert isinstance(hw, HardwareSpec) and hw.name == name
    assert hw.peak_flops > 0 and hw.mem_bandwidth > 0 and hw.memory_bytes > 0
    assert hw.interconnect_bandwidth > 0 and hw.interconnect_latency_s >= 0
    assert hw.host_link in LINKS and (hw.interconnect is None or hw.interconnect in LINKS)
    for dtype in ("fp8", "int8", "fp4"):
        peak = hw.peak(dtype)
        assert peak is None or peak >= hw.peak_flops  # narrower types never run slower


def test_the_presets_the_issue_names_and_the_old_names_exist():
    assert set(ISSUE_PRESETS) | set(OLD_PRESETS) <= set(HARDWARE)
    assert {"nvlink-3", "nvlink-4", "nvlink-5", "pcie-gen4", "pcie-gen5", "infiniband-ndr"} <= set(LINKS)


def _numbers(entry, where):  # noqa: ANN001, ANN202
    """Every numeric leaf of a data-file entry, with its place; a number must sit in {value, source}."""
    for key, value in entry.items():
        place = f"{where}.{key}"
        if isinstance(value, dict) and "value" in value:
            yield place, value
        elif isinstance(value, dict):
            yield from _numbers(value, place)
        else:
            assert not isinstance(value, (int, float)) or isinstance(value, bool), f"{place}: a number without a source"


def test_every_number_in_the_data_file_has_a_source():
    data = yaml.safe_load(DATA_FILE.read_text())
    found = [*_numbers(data["hardware"], "hardware"), *_numbers(data["links"], "links")]
    assert len(found) > 100
    for place, number in found:
        assert isinstance(number["value"], (int, float)), place
        assert isinstance(number.get("source"), str) and len(number["source"]) > 10, f"{place}: no source"


def test_memory_is_what_the_device_reports():
    # nvidia-smi's totals (MiB): an H200 143771, an H100 80GB 81559, an A100 80GB 81920.
    assert get_hardware("h200").memory_bytes == 143771 * 2**20
    assert get_hardware("h100-sxm").memory_bytes == 81559 * 2**20
    assert get_hardware("a100-80gb").memory_bytes == 81920 * 2**20


def test_the_old_presets_keep_their_peaks_bandwidths_and_links():
    old = {"a100-80gb": (312e12, 2.039e12, 300e9), "h100-sxm": (989e12, 3.35e12, 450e9),
           "h200": (989e12, 4.8e12, 450e9), "l4": (121e12, 0.3e12, 25e9), "cpu": (1e12, 50e9, 20e9)}
    for name, (peak, bandwidth, link) in old.items():
        hw = get_hardware(name)
        assert (hw.peak_flops, hw.mem_bandwidth) == (peak, bandwidth), name
        assert (LINKS[hw.interconnect].bytes_per_s if hw.interconnect else hw.interconnect_bandwidth) == link, name


def test_all_reduce_runs_at_its_measured_bus_bandwidth_and_kernels_have_their_floor():
    # The ring all-reduce's payload divides by the bus bandwidth measured at serving sizes, not
    # the link's datasheet rate (copies between devices keep that); a link without a measurement
    # (a user's, the CPU's) uses its rate.
    measured = {"a100-80gb": 90e9, "h100-sxm": 150e9, "h200": 150e9, "b200": 240e9, "l40s": 10e9, "cpu": 20e9}
    assert {name: get_hardware(name).interconnect_bandwidth for name in measured} == measured
    assert LINKS["nvlink-4"].allreduce_bandwidth == 150e9 and LINKS["pcie-gen5"].allreduce_bandwidth == 50e9
    floors = {"a100-80gb": 5.3e-6, "h100-sxm": 3.85e-6, "h200": 4.07e-6, "b200": 3.54e-6, "cpu": 0.0}
    assert {name: get_hardware(name).kernel_floor_s for name in floors} == floors
    assert get_hardware({"base": "h100-sxm", "kernel_floor_us": 2}).kernel_floor_s == 2e-6
    given = {"name": "g", "memory_gb": 1, "hbm_bandwidth_tb_s": 1, "peak_tflops": {"bf16": 1},
             "interconnect": {"bandwidth_gb_s": 100, "latency_us": 1, "allreduce_bandwidth_gb_s": 40}}
    assert get_hardware(given).interconnect_bandwidth == 40e9 and get_hardware(given).kernel_floor_s == 0.0


def test_a_mesh_all_reduces_over_the_links_to_its_peers():
    # MI300X: one xGMI link to each of 7 peers, ~48 GB/s usable each (AMD's RCCL/xGMI blog), so
    # an all-reduce over tp GPUs has tp - 1 of them, up to the link's 448 GB/s.
    m, mi300x = get_model("llama-3.1-70b"), get_hardware("mi300x")
    assert mi300x.interconnect_peer_bandwidth == 48e9
    assert [_ideal(m, mi300x, tensor_parallel=tp)._collective_link()[0] for tp in (2, 4, 8)] == [48e9, 144e9, 336e9]
    assert _ideal(m, get_hardware("h100-sxm"), tensor_parallel=2)._collective_link()[0] == 150e9  # switched
    fabric = LINKS["infinity-fabric"]
    assert mesh_bandwidth(fabric.allreduce_bandwidth, fabric.peer_bytes_per_s, 8) == 336e9
    assert _ideal(m, get_hardware("h100-sxm"), tensor_parallel=2,
                  collective_link="infinity-fabric")._collective_link()[0] == 48e9
    mesh = {"name": "m", "memory_gb": 1, "hbm_bandwidth_tb_s": 1, "peak_tflops": {"bf16": 1},
            "interconnect": {"bandwidth_gb_s": 400, "latency_us": 1, "peer_bandwidth_gb_s": 100}}
    assert _ideal(m, get_hardware(mesh), tensor_parallel=8)._collective_link()[0] == 400e9


def test_every_step_pays_its_layers_kernel_floors():
    # Llama-3.1-8B (32 layers) on an H100 (3.85 us a kernel): 7 kernels a layer add 7 x 32 x 3.85
    # us = 862.4 us of device time to any step, at any tensor parallelism (every GPU runs every
    # layer); 0 kernels a layer is the roofline before the floors.
    m, hw = get_model("llama-3.1-8b"), get_hardware("h100-sxm")
    decode = StepPlan(step_id=0, seqs=(ScheduledSeq(0, 1, 100, True, 100),))
    for tp in (1, 2, 4):
        with_floors = _ideal(m, hw, tensor_parallel=tp, kernels_per_layer=7).breakdown(decode)["dense_s"]
        without = _ideal(m, hw, tensor_parallel=tp, kernels_per_layer=0).breakdown(decode)["dense_s"]
        assert with_floors - without == pytest.approx(7 * 32 * 3.85e-6, rel=1e-9)
    assert _ideal(m, hw, kernels_per_layer=3).breakdown(decode)["dense_s"] \
        - _ideal(m, hw, kernels_per_layer=0).breakdown(decode)["dense_s"] == pytest.approx(3 * 32 * 3.85e-6, rel=1e-9)


def test_the_link_presets_keep_their_numbers():
    assert [LINKS[n].bytes_per_s for n in ("pcie-gen4-pinned", "pcie-gen5-pinned", "h200-host-pinned", "nvlink-4")] \
        == [25e9, 50e9, 55e9, 450e9]
    assert LINKS["pcie-gen4"].latency_s == 10e-6 and LINKS["nvlink-4"].latency_s == 5e-6
    assert LINKS["nvlink-4"].hop_latency == 0.6e-6 and LINKS["infiniband-ndr"].hop_latency == 2.7e-6
    assert sorted(raw_links()) == sorted(LINKS)


# --- hardware as a mapping ----------------------------------------------------------------------


def test_a_mapping_with_a_base_is_the_preset_with_changes():
    same = get_hardware({"base": "h100-sxm"})
    assert same == get_hardware("h100-sxm")
    old = get_hardware({"name": "h100-80e9", "base": "h100-sxm", "memory_gb": 80, "peak_tflops": {"fp8": None}})
    assert old.memory_bytes == 80 * 10**9 and old.peak_flops_fp8 is None and old.peak_flops == 989e12


def test_a_mapping_of_numbers_alone():
    hw = get_hardware({"name": "mine", "memory_gib": 48, "hbm_bandwidth_tb_s": 1, "peak_tflops": {"bf16": 200},
                       "interconnect": {"bandwidth_gb_s": 100, "latency_us": 3}})
    assert (hw.memory_bytes, hw.mem_bandwidth, hw.peak_flops) == (48 * 2**30, 1e12, 200e12)
    assert (hw.interconnect_bandwidth, hw.interconnect_latency_s, hw.interconnect) == (100e9, 3e-6, None)
    assert hw.host_link == "pcie-gen4-pinned"


def _experiment(**changes) -> dict:  # noqa: ANN003
    return {**json.loads(json.dumps(SMALL_EXPERIMENT)), **changes}


def test_a_mapping_hardware_runs_an_experiment_like_the_preset():
    roofline = {"name": "roofline"}
    preset = parse_experiment(_experiment(cost_model=roofline), source=None)
    mapping = parse_experiment(_experiment(cost_model=roofline, hardware={"name": "my-h100", "base": "h100-sxm"}),
                               source=None)
    by_preset, by_mapping = run_experiment(preset), run_experiment(mapping)
    assert by_mapping.info["hardware"]["name"] == "my-h100"
    assert [r.summary["median_ttft_ms"] for r in by_preset.runs] == [r.summary["median_ttft_ms"] for r in by_mapping.runs]


# --- precision ----------------------------------------------------------------------------------


def test_fp8_gemms_run_at_the_fp8_peak_and_fall_back_where_there_is_none():
    h100, a100, b200 = get_hardware("h100-sxm"), get_hardware("a100-80gb"), get_hardware("b200")
    assert h100.compute_peak("fp8") == ("fp8", 1979e12)
    assert h100.compute_peak("bf16") == h100.compute_peak("fp32") == ("bf16", 989e12)
    assert a100.compute_peak("fp8") == ("bf16", 312e12)  # no fp8 tensor cores: weight-only at bf16
    assert b200.compute_peak("fp4") == ("fp4", 9000e12)
    assert h100.compute_peak("fp4") == ("fp8", 1979e12)
    fp8 = _ideal(get_model("llama-3.1-8b"), h100, weight_dtype_bytes=1, activation_dtype="fp8", mfu=0.5)
    bf16 = _ideal(get_model("llama-3.1-8b"), h100, mfu=0.5)
    # fp8 GEMMs reach 0.75 of the share bf16 GEMMs reach (simcore.precision.PEAK_EFFICIENCY).
    assert fp8._gemm_compute_rate == pytest.approx(1979e12 * 0.5 * 0.75, rel=1e-15)
    assert bf16._gemm_compute_rate == 989e12 * 0.5
    # A long prefill is compute bound: its dense part takes about half the bf16 time at fp8.
    prefill = StepPlan(step_id=0, seqs=(ScheduledSeq(0, 8192, 0, True, 8192),))
    ratio = fp8.breakdown(prefill)["dense_s"] / bf16.breakdown(prefill)["dense_s"]
    assert ratio == pytest.approx(989 / (1979 * 0.75))


def test_default_activation_dtypes_follow_the_engines():
    assert [default_activation_dtype(w) for w in ("bf16", "fp8", "int8", "int4", "fp4", "fp32")] == \
        ["bf16", "fp8", "int8", "bf16", "bf16", "fp32"]
    exp, h100 = parse_experiment(_experiment(weight_dtype="fp4"), source=None), get_hardware("h100-sxm")
    assert exp.compute_dtype_on(h100) == "bf16"  # no fp4 peak: weight-only
    given = parse_experiment(_experiment(weight_dtype="fp4", activation_dtype="fp4"), source=None)
    assert given.compute_dtype_on(h100) == "fp4"


def test_four_bit_weights_are_half_a_byte():
    m = get_model("llama-3.1-8b")
    half, two = _ideal(m, weight_dtype_bytes=0.5), _ideal(m)
    assert half._weight_bytes_no_head == two._weight_bytes_no_head / 4
    hw = get_hardware("h100-sxm")
    blocks = {wb: num_gpu_blocks(m, hw, block_size=16, kv_dtype_bytes=2, weight_dtype_bytes=wb,
                                 gpu_memory_utilization=0.9) for wb in (0.5, 2)}
    per_block = block_bytes(m, 16, 2)
    assert blocks[0.5] - blocks[2] in range(int(m.num_params * 1.5 // per_block) - 1, int(m.num_params * 1.5 // per_block) + 2)
    kv = resolve_kv(parse_experiment(_experiment(weight_dtype="int4", kv_cache={"block_size": 16}), source=None),
                    source=None)
    assert kv["num_blocks"] == blocks[0.5]


def test_fp8_kv_is_one_byte():
    one, two = _ideal(kv_dtype_bytes=1), _ideal()
    assert one._kv_bytes_per_pos == two._kv_bytes_per_pos / 2


# --- collectives --------------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_ring_all_reduce_by_hand(tp):
    # 2 all-reduces per layer x L=2 layers; each: NCCL's 6.6 us base, 2(tp-1) hops of 1 us, plus
    # 2(tp-1)/tp of the T h a = 5 x 64 x 2 = 640 bytes over 1e8 bytes/s.
    comm = _ideal(tensor_parallel=tp).breakdown(MIXED)["comm_s"]
    assert comm == pytest.approx(4 * (6.6e-6 + 2 * (tp - 1) * 1e-6 + 2 * (tp - 1) / tp * 640 / 1e8), rel=1e-12)


def test_collective_link_bandwidth_and_latency_are_settable():
    nvlink = _ideal(tensor_parallel=2, collective_link="nvlink-4").breakdown(MIXED)["comm_s"]
    assert nvlink == pytest.approx(4 * (6.6e-6 + 2 * 0.6e-6 + 640 / 150e9))
    given = _ideal(tensor_parallel=2, collective_bandwidth_gb_s=10, collective_latency_us=2,
                   collective_base_latency_us=7).breakdown(MIXED)["comm_s"]
    assert given == pytest.approx(4 * (7e-6 + 2 * 2e-6 + 640 / 10e9))


def test_old_fixed_latency_is_reproducible():
    # Before: each all-reduce cost 2(tp-1)/tp T h w / interconnect + 5 us on an H100.
    m, hw, tp = get_model("llama-3.1-8b"), get_hardware("h100-sxm"), 4
    old = _ideal(m, hw, tensor_parallel=tp, collective_latency_us=0, collective_base_latency_us=5,
                 collective_bandwidth_gb_s=450)
    expected = 2 * m.num_layers * (2 * (tp - 1) / tp * 5 * m.hidden_size * 2 / 450e9 + 5e-6)
    assert old.breakdown(MIXED)["comm_s"] == pytest.approx(expected, rel=1e-12)


def test_old_memory_is_reproducible():
    # The old presets read the datasheet's decimal GB: 0.9 x 80e9 - 16.06e9 - 1.5 GiB of 2 MiB blocks.
    old = get_hardware({"base": "h100-sxm", "memory_gb": 80})
    m = get_model("llama-3.1-8b")
    blocks = num_gpu_blocks(m, old, block_size=16, kv_dtype_bytes=2, weight_dtype_bytes=2, gpu_memory_utilization=0.9)
    assert blocks == int((72e9 - m.num_params * 2 - 1.5 * 2**30) // block_bytes(m, 16, 2))


def test_pipeline_stages_add_their_sends_and_split_the_memory():
    one, two = _ideal(), _ideal(pipeline_parallel=2)
    p1, p2 = one.breakdown(MIXED), two.breakdown(MIXED)
    # All stages run in turn: the same dense and attention time, plus one send of T h a = 640 bytes.
    assert (p2["dense_s"], p2["attention_s"]) == (p1["dense_s"], p1["attention_s"])
    assert p2["comm_s"] == pytest.approx(1e-6 + 640 / 1e8)
    m, hw = get_model("llama-3.1-70b"), get_hardware("h200")
    kw = dict(block_size=16, kv_dtype_bytes=2, weight_dtype_bytes=2, gpu_memory_utilization=0.9, tensor_parallel=2,
              activation_reserve_bytes=0)
    stages = num_gpu_blocks(m, hw, pipeline_parallel=2, **kw)
    usable = hw.memory_bytes * 0.9
    assert stages == int((usable - m.num_params * 2 / 2 / 2) // (block_bytes(m, 16, 2, 2) // 2))
    with pytest.raises(ValueError, match="pipeline_parallel"):
        _ideal(pipeline_parallel=3)


# --- bad input ----------------------------------------------------------------------------------

GOOD = {"name": "x", "memory_mib": 1000, "hbm_bandwidth_tb_s": 1, "peak_tflops": {"bf16": 10},
        "interconnect": "nvlink-4"}


@pytest.mark.parametrize(("change", "where"), [
    ({"hbm_bandwidth_tb_s": -1}, "hardware.hbm_bandwidth_tb_s"),
    ({"hbm_bandwidth_tb_s": None}, "hardware.hbm_bandwidth_tb_s"),
    ({"peak_tflops": {"bf16": 10, "fp9": 20}}, "hardware.peak_tflops.fp9"),
    ({"peak_tflops": {"fp8": 10}}, "hardware.peak_tflops.bf16"),
    ({"peak_tflops": {"bf16": "fast"}}, "hardware.peak_tflops.bf16"),
    ({"interconnect": "nvlink-9"}, "hardware.interconnect"),
    ({"interconnect": {"bandwidth_gb_s": -5, "latency_us": 1}}, "hardware.interconnect.bandwidth_gb_s"),
    ({"host_link": "usb"}, "hardware.host_link"),
    ({"kernel_floor_us": -1}, "hardware.kernel_floor_us"),
    ({"interconnect": {"bandwidth_gb_s": 5, "latency_us": 1, "peer_bandwidth_gb_s": -1}},
     "hardware.interconnect.peer_bandwidth_gb_s"),
    ({"interconnect": {"bandwidth_gb_s": 5, "latency_us": 1, "allreduce_bandwidth_gb_s": 0}},
     "hardware.interconnect.allreduce_bandwidth_gb_s"),
    ({"memory_gb": 80}, "hardware.memory_mib"),
    ({"memory_mib": float("inf")}, "hardware.memory_mib"),
    ({"name": None}, "hardware.name"),
    ({"base": "h300"}, "hardware.base"),
    ({"color": "green"}, "hardware.color"),
])
def test_bad_hardware_is_a_clear_error_naming_the_file_and_field(change, where):
    entry = {k: v for k, v in {**GOOD, **change}.items() if v is not None or k in ("name",)}
    if change.get("name", 0) is None:
        entry.pop("name")
    with pytest.raises(ConfigError) as err:
        hardware_from_mapping(entry, source="exp.yaml")
    assert str(err.value).startswith(f"exp.yaml: {where}:"), str(err.value)


def test_unknown_dtypes_are_errors():
    with pytest.raises(ValueError, match="activation_dtype"):
        _ideal(activation_dtype="fp9")
    with pytest.raises(ConfigError, match="activation_dtype"):
        parse_experiment(_experiment(activation_dtype="fp9"), source="exp.yaml")
    with pytest.raises(ConfigError, match="weight_dtype"):
        parse_experiment(_experiment(weight_dtype="int3"), source="exp.yaml")


def test_cli_exits_2_on_a_negative_bandwidth(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(_experiment(hardware={"base": "h100-sxm", "hbm_bandwidth_tb_s": -3.35})))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "experiments.cli", "run", str(path), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("servesim: error:")]
    assert len(errors) == 1 and f"{path}: hardware.hbm_bandwidth_tb_s" in errors[0], done.stderr


def test_hardware_command_lists_presets_and_links(capsys):
    assert main(["hardware"]) == 0
    out = capsys.readouterr().out
    for name in (*ISSUE_PRESETS, "nvlink-5", "infiniband-ndr"):
        assert name in out
    assert main(["hardware", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {row["name"] for row in data["hardware"]} == set(HARDWARE)
    h200 = next(row for row in data["hardware"] if row["name"] == "h200")
    assert h200["fp8_tflops"] == 1979 and h200["memory_bytes"] == 143771 * 2**20
    assert "source" in data["sources"]["hardware"]["h200"]["memory_mib"]


def test_specs_stay_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_hardware("b200").peak_flops_fp4 = 1.0  # type: ignore[misc]
