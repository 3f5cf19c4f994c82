"""Loading Hugging Face Llama-family weights (local `*.safetensors`, sharded or not) into LlamaModel.

Most families keep q/k/v and gate/up as separate tensors; our model fuses them, so each HF name
maps to a row range of one of our parameters (Phi-3's qkv_proj and gate_up_proj are already
fused, in the same row order, and fill the whole parameter). Every target range must be filled
exactly once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from backends.torch.model import LlamaModel
from simcore.errors import ServesimError

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# HF names that carry no weights we need.
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.masked_bias|\.attn\.bias)$")


def target_of(model: LlamaModel, hf_name: str) -> tuple[str, slice] | None:
    """Our parameter name and row slice for one HF tensor name (None: not ours to load)."""
    spec = model.spec
    q, kv, inter = spec.num_q_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.intermediate_size
    whole = slice(None)
    if hf_name == "model.embed_tokens.weight":
        return "embed.weight", whole
    if hf_name == "model.norm.weight":
        return "norm.weight", whole
    if hf_name == "lm_head.weight":
        return (None if model.lm_head is None else ("lm_head.weight", whole))
    match = _LAYER.match(hf_name)
    if match is None:
        return None
    index, rest = int(match.group(1)), match.group(2)
    prefix = f"layers.{index}."
    fused = {
        "self_attn.q_proj": ("qkv_proj", slice(0, q)),
        "self_attn.k_proj": ("qkv_proj", slice(q, q + kv)),
        "self_attn.v_proj": ("qkv_proj", slice(q + kv, q + 2 * kv)),
        "mlp.gate_proj": ("gate_up_proj", slice(0, inter)),
        "mlp.up_proj": ("gate_up_proj", slice(inter, 2 * inter)),
        "self_attn.qkv_proj": ("qkv_proj", whole),  # Phi-3
        "mlp.gate_up_proj": ("gate_up_proj", whole),  # Phi-3
    }
    plain = {
        "self_attn.o_proj.weight": "o_proj.weight",
        "mlp.down_proj.weight": "down_proj.weight",
        "input_layernorm.weight": "input_norm.weight",
        "post_attention_layernorm.weight": "post_attn_norm.weight",
        "self_attn.q_norm.weight": "q_norm.weight",  # Qwen3, Gemma 3
        "self_attn.k_norm.weight": "k_norm.weight",
        "pre_feedforward_layernorm.weight": "pre_mlp_norm.weight",  # Gemma 2/3
        "post_feedforward_layernorm.weight": "post_mlp_norm.weight",
    }
    if rest in plain:
        return prefix + plain[rest], whole
    module, _, kind = rest.rpartition(".")
    if module in fused and kind in ("weight", "bias"):
        ours, rows = fused[module]
        return f"{prefix}{ours}.{kind}", rows
    return None


@torch.no_grad()
def load_hf_state(model: LlamaModel, tensors: Iterable[tuple[str, torch.Tensor]], *, source: str = "weights") -> None:
    """Copy (HF name, tensor) pairs into the model; error on unknown, misshapen or missing tensors."""
    params = dict(model.named_parameters())
    filled: dict[str, int] = {name: 0 for name in params}
    for hf_name, tensor in tensors:
        if _IGNORED.search(hf_name):
            continue
        target = target_of(model, hf_name)
        if target is None:
            if hf_name == "lm_head.weight":  # tied model: the checkpoint may still carry a copy
                continue
            raise ServesimError(f"{source}: tensor {hf_name!r} has no place in a {model.spec.name!r} model")
        name, rows = target
        if name not in params:
            raise ServesimError(f"{source}: tensor {hf_name!r} maps to {name!r}, which this model lacks")
        dest = params[name][rows]
        if tuple(dest.shape) != tuple(tensor.shape):
            raise ServesimError(
                f"{source}: tensor {hf_name!r} has shape {tuple(tensor.shape)}, the model "
                f"{model.spec.name!r} expects {tuple(dest.shape)}"
            )
        dest.copy_(tensor)
        filled[name] += dest.numel()
    missing = [name for name, p in params.items() if filled[name] != p.numel()]
    if missing:
        raise ServesimError(f"{source}: checkpoint does not fill {len(missing)} parameters, e.g. {missing[:4]}")


def checkpoint_files(path: str | Path) -> list[Path]:
    """The safetensors files of a local checkpoint directory (index-listed shards or *.safetensors)."""
    root = Path(path)
    if not root.is_dir():
        raise ServesimError(f"weights: {root} is not a directory with config.json and *.safetensors")
    index = root / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as exc:
            raise ServesimError(f"{index}: not a safetensors index ({exc})") from None
        files = sorted({root / name for name in weight_map.values()})
    else:
        files = sorted(root.glob("*.safetensors"))
    missing = [f for f in files if not f.exists()]
    if not files or missing:
        raise ServesimError(f"weights: no safetensors files in {root}" + (f" (missing {missing})" if missing else ""))
    return files


def iter_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs from every shard, one tensor in memory at a time."""
    from safetensors import safe_open

    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt", device=str(device)) as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)


def load_checkpoint(model: LlamaModel, path: str | Path) -> None:
    """Load a local HF checkpoint directory into `model` (checks config.json geometry first)."""
    check_config(model, Path(path) / "config.json")
    load_hf_state(model, iter_checkpoint(path, model.device), source=str(path))


def check_config(model: LlamaModel, config_path: Path) -> None:
    """Refuse a checkpoint whose config.json geometry differs from the model we built."""
    if not config_path.exists():
        return  # shapes are still checked tensor by tensor
    config = json.loads(config_path.read_text())
    spec = model.spec
    expected = {
        "num_hidden_layers": spec.num_layers, "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_q_heads, "num_key_value_heads": spec.num_kv_heads,
        "intermediate_size": spec.intermediate_size, "vocab_size": spec.vocab_size,
    }
    wrong = {k: (v, config[k]) for k, v in expected.items() if k in config and config[k] != v}
    if wrong:
        details = ", ".join(f"{k}: model {a}, checkpoint {b}" for k, (a, b) in wrong.items())
        raise ServesimError(f"{config_path}: checkpoint geometry differs from model {spec.name!r} ({details})")
