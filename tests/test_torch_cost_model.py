"""The torch cost model through the registry: params, timing, warm-up hygiene, clear errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from backends.base import CostContext, step_extras  # noqa: E402
from backends.registry import build_cost_model  # noqa: E402
from simcore.errors import ConfigError, ServesimError  # noqa: E402
from tests.test_torch_support import seq, step, tiny_spec  # noqa: E402

SPEC = tiny_spec()


def ctx(**kw) -> CostContext:
    base = dict(model=SPEC, hardware_name="cpu", block_size=4, num_blocks=16, num_host_blocks=4, seed=3)
    return CostContext(**{**base, **kw})


def test_step_time_runs_the_plan_and_reports_gpu_time():
    cm = build_cost_model("torch", {"device": "cpu", "record_tokens": True}, ctx())
    assert cm.engine.model.dtype == torch.float32
    dt = cm.step_time(step(seq(1, 9, 0, 9, [0, 1, 2])))
    assert dt > 0
    assert step_extras(cm)["gpu_time_s"] == pytest.approx(dt)
    cm.step_time(step(seq(1, 1, 9, 9, [0, 1, 2]), step_id=1))
    tokens = cm.output_token_ids(1)
    assert len(tokens) == 2
    assert [t for _, _, t in cm.token_log] == tokens
    assert cm.step_time(step(blocks_to_swap_out=((0, 1),), step_id=2)) > 0


def test_warmup_leaves_no_trace():
    cm = build_cost_model("torch", {"device": "cpu", "warmup_rounds": 2}, ctx())
    pool = cm.engine.pool
    assert torch.count_nonzero(pool.kv[:, :, : pool.num_blocks]) == 0  # simulator blocks untouched
    assert torch.count_nonzero(pool.kv[:, :, pool.num_blocks:]) > 0  # scratch blocks were used
    assert not cm.engine.tokens._outputs  # no warm-up request state left
    # ...and the warm-up did not change what a request computes.
    cold = build_cost_model("torch", {"device": "cpu", "warmup_rounds": 0}, ctx())
    for model in (cm, cold):
        model.step_time(step(seq(1, 9, 0, 9, [0, 1, 2])))
        model.step_time(step(seq(1, 1, 9, 9, [0, 1, 2])))
    assert cm.output_token_ids(1) == cold.output_token_ids(1)


@pytest.mark.parametrize(("params", "kw", "match"), [
    ({"device": "cpu", "colour": 1}, {}, "unknown key"),
    ({"device": "cpu", "dtype": "fp12"}, {}, "unknown dtype"),
    ({"device": "cpu", "attention": "fastest"}, {}, "unknown attention backend"),
    ({"device": "cpu", "attention": "triton"}, {}, "triton"),
    ({"device": "cpu", "sampling": {"temprature": 1.0}}, {}, "temprature"),
    ({"device": "cpu", "sampling": {"top_p": 0}}, {}, "top_p"),
    ({"device": "cpu", "cuda_graphs": True}, {}, "cuda_graphs needs device cuda"),
    ({"device": "cpu"}, {"num_blocks": 0}, "num_blocks"),
])
def test_bad_params_are_config_errors(params, kw, match):
    with pytest.raises(ConfigError, match=match):
        build_cost_model("torch", params, ctx(**kw))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_without_cuda_is_a_clear_error():
    with pytest.raises(ServesimError, match="CUDA is not available"):
        build_cost_model("torch", {"device": "cuda"}, ctx())


def test_out_of_memory_names_model_dtype_and_pool(monkeypatch):
    import backends.torch.factory as factory

    def boom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    monkeypatch.setattr(factory, "KVPool", boom)
    with pytest.raises(ServesimError) as info:
        build_cost_model("torch", {"device": "cpu", "dtype": "bf16"}, ctx(num_blocks=123, block_size=8))
    text = str(info.value)
    for part in ("tiny-test", "bfloat16", "num_blocks=123", "block_size=8"):
        assert part in text


def test_weights_path_is_relative_to_the_experiment_file(tmp_path):
    source = tmp_path / "exp.yaml"
    source.write_text("")
    with pytest.raises(ServesimError, match=str(tmp_path / "ckpt")):
        build_cost_model("torch", {"device": "cpu", "weights": "ckpt"}, ctx(source=source))
