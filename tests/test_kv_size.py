"""`servesim kv-size` and the seed's KV-size numbers (sections 21.1, 21.6)."""

from __future__ import annotations

import argparse
import importlib.util
import json

import pytest

from experiments.commands import COMMANDS, kv_size
from simcore.errors import ConfigError
from simcore.model import kv_cache_bytes, kv_cache_gib


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    kv_size.add_arguments(parser)
    return kv_size.run(parser.parse_args(argv))


def _values(out: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line and not line.startswith("#"))


@pytest.mark.parametrize(("kv_heads", "gib"), [(8, 1.0), (2, 0.25), (1, 0.125)])
def test_seed_kv_cache_gib(kv_heads, gib):
    assert kv_cache_gib(layers=32, batch=1, kv_heads=kv_heads, seq_len=8192, head_dim=128) == gib


def test_seed_21_6_bytes_per_processed_position():
    # L=2, H_KV=4, d_h=8, s=2: 256 bytes per position; 5..8 processed positions.
    sizes = [kv_cache_bytes(layers=2, batch=1, kv_heads=4, seq_len=t, head_dim=8) for t in (5, 6, 7, 8)]
    assert sizes == [1280, 1536, 1792, 2048]


def test_seed_21_1_selection_before_append():
    # One layer, one KV head, width 2: 24 bytes after a 3-token prefill, 32 once token 4 is processed.
    assert [kv_cache_bytes(layers=1, batch=1, kv_heads=1, seq_len=t, head_dim=2) for t in (3, 4)] == [24, 32]


@pytest.mark.parametrize(("kv_heads", "gib", "num_bytes"), [(8, "1.0", 2**30), (2, "0.25", 2**28), (1, "0.125", 2**27)])
def test_cli_geometry_flags(capsys, kv_heads, gib, num_bytes):
    assert _run(["--layers", "32", "--kv-heads", str(kv_heads), "--head-dim", "128", "--tokens", "8192"]) == 0
    values = _values(capsys.readouterr().out)
    assert values["kv_gib"] == gib and values["kv_bytes"] == str(num_bytes)


def test_cli_model_preset(capsys):
    assert _run(["--model", "llama-3.1-8b", "--tokens", "8192"]) == 0
    out = capsys.readouterr().out
    values = _values(out)
    assert values["kv_gib"] == "1.0" and values["bytes_per_token"] == "131072" and values["model"] == "llama-3.1-8b"
    assert "GiB" in out.splitlines()[-1]


def test_cli_json_batch_and_dtype(capsys):
    assert _run(["--model", "llama-3.1-8b", "--tokens", "8192", "--batch", "4", "--dtype", "fp8", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kv_gib"] == 2.0 and result["kv_bytes"] == 2 * 2**30 and result["bytes_per_value"] == 1


def test_cli_model_from_config_json(tmp_path, capsys):
    raw = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 32,
           "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 64, "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert _run(["--model", str(tmp_path), "--tokens", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_bytes"] == 1280  # the 21.6 example's geometry


def test_cli_caps_sliding_window_layers(tmp_path, capsys):
    # Gemma 2: every other layer slides over 4 positions; 2 layers x 2 KV heads x 8 wide x 2 bytes.
    raw = {"architectures": ["Gemma2ForCausalLM"], "num_hidden_layers": 4, "hidden_size": 32, "head_dim": 8,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 100,
           "sliding_window": 4}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    per_layer = 2 * 2 * 8 * 2
    assert _run(["--model", str(tmp_path), "--tokens", "3", "--json"]) == 0
    short = json.loads(capsys.readouterr().out)
    assert short["kv_bytes"] == short["kv_bytes_allocated"] == 4 * 3 * per_layer  # inside the window
    assert _run(["--model", str(tmp_path), "--tokens", "10", "--batch", "2", "--json"]) == 0
    long = json.loads(capsys.readouterr().out)
    assert long["kv_bytes"] == 2 * (2 * 10 + 2 * 4) * per_layer
    assert long["kv_bytes_allocated"] == 2 * 4 * 10 * per_layer
    assert (long["bytes_per_token"], long["bytes_per_token_past_window"]) == (4 * per_layer, 2 * per_layer)
    assert (long["sliding_window"], long["sliding_layers"]) == (4, 2)
    assert _run(["--model", str(tmp_path), "--tokens", "10"]) == 0
    assert "allocates" in capsys.readouterr().out.splitlines()[-1]


def test_cli_rejects_mixed_or_missing_geometry():
    with pytest.raises(ConfigError, match="drop --layers"):
        _run(["--model", "llama-3.1-8b", "--layers", "4", "--tokens", "8"])
    with pytest.raises(ConfigError, match="missing --head-dim"):
        _run(["--layers", "4", "--kv-heads", "2", "--tokens", "8"])
    with pytest.raises(ConfigError, match="did you mean 'llama-3.1-8b'"):
        _run(["--model", "llama-3.1-8", "--tokens", "8"])


def test_cli_rejects_non_positive_numbers():
    with pytest.raises(SystemExit):
        _run(["--layers", "0", "--kv-heads", "2", "--head-dim", "8", "--tokens", "8"])


def _all_commands_importable() -> bool:
    return all(importlib.util.find_spec(module) is not None for module, _ in COMMANDS.values())


@pytest.mark.skipif(not _all_commands_importable(), reason="other servesim subcommands are not written yet")
def test_through_servesim_main(capsys):
    from experiments.cli import main

    assert main(["kv-size", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--tokens", "8192"]) == 0
    assert _values(capsys.readouterr().out)["kv_gib"] == "1.0"
    assert main(["kv-size", "--model", "no-such-model", "--tokens", "8"]) == 2
    assert "unknown model" in capsys.readouterr().err
