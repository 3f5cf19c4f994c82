"""Profiling the torch engine: the grid, the table it writes, the `servesim profile` command."""

from __future__ import annotations

import argparse

import pytest

torch = pytest.importorskip("torch")

from backends.profiled import REQUIRED_COLUMNS, read_profile  # noqa: E402
from backends.torch.profile import design_grid, run_profile  # noqa: E402
from tests.test_torch_support import tiny_spec  # noqa: E402


def test_grid_covers_kinds_within_limits():
    shapes = design_grid(max_context=2048, max_batch=64, max_kv_tokens=50_000)
    kinds = {s.kind for s in shapes}
    assert kinds == {"prefill", "decode", "mixed"}
    for s in shapes:
        assert s.kv_positions() <= 50_000
        assert all(q + c <= 2048 for q, c in s.prefill)
        assert len(s.decodes) <= 64
        assert all(c < 2048 for c in s.decodes)
    assert len(design_grid(max_context=2048, max_batch=64, quick=True)) < len(shapes)


def test_run_profile_writes_a_readable_table(tmp_path):
    out = tmp_path / "p.csv"
    rows = run_profile(tiny_spec(), out=out, device="cpu", block_size=8, max_context=64, max_batch=4,
                       quick=True, reps=1)
    table = read_profile(out)
    assert len(table.rows) == len(rows) > 5
    assert table.header["dtype"] == "float32"
    assert table.model_geometry["num_kv_heads"] == 2
    assert table.header["block_size"] == "8"
    assert {r["kind"] for r in table.rows} >= {"prefill", "decode"}
    assert out.read_text().splitlines()[len(table.header)].startswith(",".join(REQUIRED_COLUMNS))


def test_profile_command_prints_held_out_error(tmp_path, capsys):
    from experiments.commands import profile

    parser = argparse.ArgumentParser()
    profile.add_arguments(parser)
    out = tmp_path / "cmd.csv"
    args = parser.parse_args(["--model", "tiny-llama", "--device", "cpu", "--out", str(out), "--quick",
                              "--max-context", "64", "--max-batch", "4", "--reps", "1", "--threads", "1"])
    torch_threads = torch.get_num_threads()
    try:
        assert profile.run(args) == 0
    finally:
        torch.set_num_threads(torch_threads)
    text = capsys.readouterr().out
    assert "held-out error" in text
    assert read_profile(out).header["model"]


def test_grid_has_multi_piece_and_long_context_prefills_and_rounds_interleave(tmp_path):
    shapes = design_grid(max_context=1024, max_batch=32)
    assert any(s.kind == "prefill" and len(s.prefill) >= 4 for s in shapes)
    assert any(s.kind == "mixed" and len(s.prefill) >= 2 for s in shapes)
    assert any(s.kind == "prefill" and s.prefill[0][1] + s.prefill[0][0] == 1024 for s in shapes)
    from backends.base import CostContext
    from backends.torch.factory import make_torch
    from backends.torch.profile import profile_rows

    small = design_grid(max_context=64, max_batch=4, quick=True)
    ctx = CostContext(model=tiny_spec(), hardware_name="cpu", block_size=8,
                      num_blocks=max(s.num_blocks(8) for s in small) + 1)
    model = make_torch({"device": "cpu", "warmup_rounds": 0}, ctx)
    rounds = []
    rows = profile_rows(model, small, 2, round_progress=lambda done, total: rounds.append((done, total)))
    assert rounds == [(0, 3), (1, 3), (2, 3)]
    assert len(rows) == len(small) and all(r["time_s"] > 0 for r in rows)
    assert {r["num_prefill_continuations"] for r in rows} >= {0.0, 1.0}
    # The untimed first run of each shape is kept beside the median: a serving run meets most prompt
    # shapes once, so what a first run costs above the median is what a profile's time_s lacks.
    assert all(r["first_time_s"] > 0 for r in rows)
    blocked = profile_rows(model, small[:3], 1, interleave=False)
    assert [r["num_seqs"] for r in blocked] == [r["num_seqs"] for r in rows[:3]]
    assert all("first_time_s" not in r for r in blocked)


def test_profile_table_keeps_first_run_times(tmp_path):
    out = tmp_path / "p.csv"
    run_profile(tiny_spec(), out=out, device="cpu", block_size=8, max_context=64, max_batch=4, quick=True, reps=1)
    header = next(line for line in out.read_text().splitlines() if not line.startswith("#"))
    assert "first_time_s" in header.split(",")
    assert read_profile(out).rows  # an extra column the reader ignores
