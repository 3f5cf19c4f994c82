"""The profiled cost model: table parsing (with clear errors), the fit, predictions. No torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backends.base import CostContext
from backends.profiled import (
    ProfiledCostModel,
    StepTimeFit,
    holdout_report,
    make_profiled,
    nnls,
    plan_shape,
    read_profile,
    step_kind,
)
from simcore.errors import ConfigError
from simcore.model import ModelSpec
from simcore.plan import ScheduledSeq, StepPlan

TABLE = Path(__file__).parent / "data" / "profiles" / "cpu-tiny-llama.csv"
TINY = ModelSpec(name="tiny-llama", num_layers=2, hidden_size=64, num_q_heads=4, num_kv_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=256, max_position_embeddings=2048)


def ctx(model: ModelSpec = TINY, source: Path | None = None) -> CostContext:
    return CostContext(model=model, hardware_name="cpu", block_size=16, num_blocks=64, source=source)


def decode_plan(batch: int, context: int) -> StepPlan:
    return StepPlan(0, tuple(ScheduledSeq(i, 1, context, True, context) for i in range(batch)))


def prefill_plan(tokens: int, context: int = 0) -> StepPlan:
    return StepPlan(0, (ScheduledSeq(0, tokens, context, True, tokens + context),))


def test_shipped_table_fits_and_predicts_sensibly():
    table = read_profile(TABLE)
    assert table.header["device"].startswith("cpu")
    assert table.model_geometry["name"] == "tiny-llama"
    model = ProfiledCostModel.from_table(table)
    assert all(v >= 0 for v in model.fit.terms().values())
    # Longer contexts, larger batches and longer prefills never get cheaper.
    assert model.step_time(decode_plan(8, 900)) >= model.step_time(decode_plan(8, 100))
    assert model.step_time(decode_plan(32, 500)) >= model.step_time(decode_plan(4, 500))
    assert model.step_time(prefill_plan(1024)) > model.step_time(prefill_plan(64)) > 0
    # A mixed step costs more than either part and less than both run as separate steps.
    chunk, decodes = prefill_plan(256, 256), decode_plan(16, 256)
    mixed = StepPlan(0, chunk.seqs + tuple(ScheduledSeq(100 + i, 1, 256, True, 256) for i in range(16)))
    parts = model.step_time(chunk), model.step_time(decodes)
    assert max(parts) < model.step_time(mixed) < sum(parts)


def test_shipped_table_held_out_error_is_reasonable():
    report = holdout_report(read_profile(TABLE).rows)
    assert report["num_test"] >= 5
    # CPU timings on a shared machine are noisy; this guards against a broken fit, not noise.
    assert report["median_abs_rel_error"] < 0.35


def test_fit_recovers_a_known_linear_cost():
    rng = np.random.default_rng(0)
    truth = {"const": 2e-3, "token": 1e-5, "pair": 3e-9, "kv": 2e-8}
    rows = []
    for _ in range(60):
        p, c, b, dc = (int(x) for x in (rng.integers(0, 4096), rng.integers(0, 8192), rng.integers(0, 128),
                                        rng.integers(1, 8192)))
        plan = StepPlan(0, (*((ScheduledSeq(0, p, c, True, p + c),) if p > 1 else ()),
                           *(ScheduledSeq(i + 1, 1, dc, True, dc) for i in range(b))))
        shape = plan_shape(plan)
        if not plan.seqs:
            continue
        t = (truth["const"] + truth["token"] * (shape["num_prefill_tokens"] + shape["num_decode_tokens"])
             + truth["pair"] * (shape["sum_prefill_context"] + shape["sum_prefill_causal"])
             + truth["kv"] * (shape["sum_decode_context"] + shape["num_decode_tokens"]))
        rows.append({"kind": step_kind(shape), **shape, "time_s": t})
    fit = StepTimeFit.fit(rows)
    y = np.array([r["time_s"] for r in rows])
    assert np.abs(fit.predict(rows) / y - 1).max() < 1e-6


def test_nnls_satisfies_optimality_conditions():
    rng = np.random.default_rng(1)
    for _ in range(50):
        a, b = rng.normal(size=(15, 5)), rng.normal(size=15)
        x = nnls(a, b)
        grad = a.T @ (b - a @ x)
        assert (x >= 0).all()
        assert (grad[x == 0] <= 1e-9).all()
        assert np.allclose(grad[x > 0], 0, atol=1e-9)


def test_plan_shape_counts_decode_and_prefill_parts():
    plan = StepPlan(0, (ScheduledSeq(0, 10, 6, False, 30), ScheduledSeq(1, 1, 40, True, 20),
                        ScheduledSeq(2, 1, 3, True, 9)))
    shape = plan_shape(plan)
    assert shape["num_prefill_tokens"] == 11  # a one-token prompt chunk is not a decode
    assert shape["num_decode_tokens"] == 1
    assert shape["sum_prefill_context"] == 10 * 6 + 1 * 3
    assert shape["sum_prefill_causal"] == 55 + 1
    assert shape["sum_decode_context"] == 40
    assert shape["max_context"] == 40 and shape["num_selecting"] == 2
    assert step_kind(shape) == "mixed"


def test_make_profiled_resolves_table_next_to_the_experiment(tmp_path):
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "t.csv").write_text(TABLE.read_text())
    source = tmp_path / "exp.yaml"
    source.write_text("")
    model = make_profiled({"table": "tables/t.csv", "link": "pcie-gen4"}, ctx(source=source))
    plan = StepPlan(0, decode_plan(4, 100).seqs, blocks_to_swap_in=((0, 1), (1, 2)), block_bytes=10**6)
    assert model.transfer_time(plan) == pytest.approx(10e-6 + 2e6 / 25e9)
    assert model.step_time(plan) == pytest.approx(model.step_time(decode_plan(4, 100)) + model.transfer_time(plan))


def test_table_of_another_model_is_refused_unless_allowed():
    other = ModelSpec(name="big", num_layers=32, hidden_size=4096, num_q_heads=32, num_kv_heads=8, head_dim=128,
                      intermediate_size=14336, vocab_size=128256)
    with pytest.raises(ConfigError, match="num_layers: table 2, model 32"):
        make_profiled({"table": str(TABLE)}, ctx(other))
    assert make_profiled({"table": str(TABLE), "check_model": False}, ctx(other)).step_time(decode_plan(1, 10)) > 0


def test_missing_table_param_and_unknown_keys():
    with pytest.raises(ConfigError, match="needs a table"):
        make_profiled({}, ctx())
    with pytest.raises(ConfigError, match="unknown key"):
        make_profiled({"table": str(TABLE), "tabel": 1}, ctx())
    with pytest.raises(ConfigError, match="cannot read profile table"):
        make_profiled({"table": "/nonexistent/t.csv"}, ctx())


HEADER = ("kind,num_seqs,num_prefill_tokens,num_decode_tokens,sum_context,max_context,sum_prefill_context,"
          "sum_prefill_causal,sum_decode_context,num_selecting,time_s")
GOOD = "decode,2,0,2,20,10,0,0,20,2,0.001"


@pytest.mark.parametrize(("text", "match"), [
    (f"# device: cpu\n{HEADER}\n{GOOD}\ndecode,2,0,2,20,10,0,0,20,2,fast\n", r"line 4: column time_s: not a number"),
    (f"{HEADER}\n{GOOD}\ndecode,2,0,2,20,10,0,0,20,2\n", "line 3: row has 10 fields"),
    (f"{HEADER}\ndecode,2,0,2,20,10,0,0,20,2,-1\n", "line 2: column time_s: expected a positive"),
    (f"{HEADER}\ndecode,2,0,2,20,10,0,0,20,2,0\n", "line 2: column time_s"),
    ("kind,num_seqs,time_s\ndecode,1,0.1\n", "line 1: profile table lacks columns"),
    ("# device: cpu\n", "no rows"),
    (f"# model: {{not json\n{HEADER}\n{GOOD}\n", "model:' header is not JSON"),
])
def test_malformed_tables_name_file_and_line(tmp_path, text, match):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as info:
        read_profile(path)
    assert str(path) in str(info.value)


def test_profiled_module_imports_without_torch():
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None; import backends.profiled, backends.registry; "
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parents[1])
    assert out.stdout.strip() == "ok", out.stderr


def test_held_out_error_is_reported_by_kind_and_for_extrapolations():
    from backends.profiled import format_holdout

    report = holdout_report(read_profile(TABLE).rows)
    assert set(report["by_kind"]) == {"decode", "prefill", "mixed"}
    assert sum(d["count"] for d in report["by_kind"].values()) == report["num_test"] == len(read_profile(TABLE).rows)
    assert report["mixed_from_pure"]["count"] >= 1 and report["long_from_short"]["count"] >= 1
    lines = format_holdout(report)
    assert "held-out error" in lines[0] and any("mixed steps from a fit" in line for line in lines)
    assert format_holdout(holdout_report(read_profile(TABLE).rows[:3]))[0].startswith("too few shapes")


def test_fit_recovers_per_piece_continuation_and_decode_path_costs():
    rng = np.random.default_rng(3)
    truth = {"const": 1e-3, "token": 2e-6, "pair": 1e-9, "kv": 1e-8, "piece": 2e-4, "cont": 3e-4, "ctx": 5e-8,
             "decode_path": 4e-4}
    rows = []
    for _ in range(120):
        pieces = int(rng.integers(0, 4))
        prefill = tuple((int(rng.integers(2, 512)), int(rng.choice([0, int(rng.integers(1, 4096))])))
                        for _ in range(pieces))
        decodes = int(rng.integers(0 if pieces else 1, 32))
        seqs = [ScheduledSeq(i, q, c, True, q + c) for i, (q, c) in enumerate(prefill)]
        seqs += [ScheduledSeq(100 + i, 1, int(rng.integers(1, 4096)), True, 1) for i in range(decodes)]
        shape = plan_shape(StepPlan(0, tuple(seqs)))
        t = (truth["const"] + truth["token"] * (shape["num_prefill_tokens"] + shape["num_decode_tokens"])
             + truth["pair"] * (shape["sum_prefill_context"] + shape["sum_prefill_causal"])
             + truth["kv"] * (shape["sum_decode_context"] + shape["num_decode_tokens"])
             + truth["piece"] * pieces + truth["cont"] * shape["num_prefill_continuations"]
             + truth["ctx"] * sum(c for _, c in prefill) + truth["decode_path"] * (decodes > 0))
        rows.append({"kind": step_kind(shape), **shape, "time_s": t})
    fit = StepTimeFit.fit(rows)
    y = np.array([r["time_s"] for r in rows])
    assert np.abs(fit.predict(rows) / y - 1).max() < 1e-6
    terms = fit.terms()
    assert terms["per_continued_piece_s"] == pytest.approx(truth["cont"], rel=1e-3)
    assert terms["decode_path_s"] == pytest.approx(truth["decode_path"], rel=1e-3)


def test_tables_without_the_continuation_column_derive_it(tmp_path):
    path = tmp_path / "old.csv"
    path.write_text(HEADER + "\nprefill,1,64,0,512,512,32768,2080,0,1,0.002\nprefill,1,64,0,0,0,0,2080,0,1,0.001\n")
    rows = read_profile(path).rows
    assert "num_prefill_continuations" not in rows[0]
    from backends.profiled import _continuations

    assert [_continuations(r) for r in rows] == [1.0, 0.0]
    plan = StepPlan(0, (ScheduledSeq(0, 64, 512, True, 576), ScheduledSeq(1, 8, 0, False, 20),
                        ScheduledSeq(2, 1, 30, True, 30)))
    assert plan_shape(plan)["num_prefill_continuations"] == 1


@pytest.mark.parametrize("policy", [{"name": "continuous"}, {"name": "chunked_prefill", "chunk_size": 32}])
def test_fast_path_with_a_profiled_table_matches_stepping(policy):
    import pandas as pd

    from policies.accelerate import accelerator_for
    from policies.registry import make_policy
    from simcore.cluster import simulate
    from simcore.metrics import request_frame
    from tests.helpers import req

    model = ProfiledCostModel.from_table(read_profile(TABLE))
    rng = np.random.default_rng(1)
    requests = [req(i, 0.002 * i, int(rng.integers(8, 200)), int(rng.integers(1, 60))) for i in range(80)]
    frames = []
    for fast in (False, True):
        options = {k: v for k, v in policy.items() if k != "name"}
        p = make_policy(policy["name"], num_blocks=256, block_size=16, max_num_seqs=16, max_num_batched_tokens=256,
                        **options)
        result = simulate(requests, p, model, accelerator=accelerator_for(p) if fast else None)
        frames.append((request_frame(result.requests), pd.DataFrame(result.steps.as_dict()), result.num_events))
    pd.testing.assert_frame_equal(frames[0][0], frames[1][0], check_exact=True)
    pd.testing.assert_frame_equal(frames[0][1], frames[1][1], check_exact=True)
    assert frames[1][2] < frames[0][2]  # the fast path did take runs of steps at once
