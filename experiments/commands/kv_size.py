"""`servesim kv-size`: the KV-cache payload (docs/kv-cache.md#bytes-per-token) for a preset, a config.json or raw geometry."""

from __future__ import annotations

import argparse
import json

from simcore.errors import ConfigError
from simcore.model import DTYPE_BYTES, GIB, kv_cache_bytes, kv_cache_gib


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="a model preset name or a path to a Hugging Face config.json "
                                        "(or its folder); replaces --layers/--kv-heads/--head-dim")
    parser.add_argument("--layers", type=_positive_int, help="number of decoder layers L")
    parser.add_argument("--kv-heads", type=_positive_int, help="key-value heads H_KV per layer")
    parser.add_argument("--head-dim", type=_positive_int, help="head width d_h")
    parser.add_argument("--tokens", type=_positive_int, required=True, help="processed positions T per request")
    parser.add_argument("--batch", type=_positive_int, default=1, help="requests B")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPE_BYTES), help="KV scalar type")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of key=value lines")


def run(args: argparse.Namespace) -> int:
    geometry = _geometry(args)
    bytes_per_value = DTYPE_BYTES[args.dtype]
    sizes = dict(layers=geometry["layers"], batch=args.batch, kv_heads=geometry["kv_heads"],
                 seq_len=args.tokens, head_dim=geometry["head_dim"], bytes_per_value=bytes_per_value)
    result = {
        "model": geometry["model"],
        "layers": sizes["layers"],
        "kv_heads": sizes["kv_heads"],
        "head_dim": sizes["head_dim"],
        "tokens": args.tokens,
        "batch": args.batch,
        "dtype": args.dtype,
        "bytes_per_value": bytes_per_value,
        # Bytes one processed position adds to one request (docs/kv-cache.md#bytes-per-token)
        "bytes_per_token": kv_cache_bytes(**{**sizes, "batch": 1, "seq_len": 1}),
        "kv_bytes": kv_cache_bytes(**sizes),
        "kv_gib": kv_cache_gib(**sizes),
    }
    spec = geometry["spec"]
    if spec is not None and spec.is_mla:
        # Multi-head latent attention (DeepSeek): one latent of kv_lora_rank + qk_rope_head_dim
        # scalars per position per layer, shared by every head, not K and V per KV head
        # (docs/kv-cache.md#multi-head-latent-attention).
        per_token = spec.kv_bytes_per_token(bytes_per_value)
        result.update({
            "kv_heads": None, "head_dim": None, "attention": "mla", "kv_lora_rank": spec.kv_lora_rank,
            "qk_rope_head_dim": spec.qk_rope_head_dim, "bytes_per_token": per_token,
            "kv_bytes": per_token * args.tokens * args.batch, "kv_gib": per_token * args.tokens * args.batch / GIB,
        })
    if spec is not None and spec.num_sliding_layers:
        # Sliding-window layers keep only their last `sliding_window` positions, so the bytes a
        # request needs grow at the full-attention layers' rate past the window. The paged pool
        # (simulator and real engine) still allocates every position of every layer: that
        # figure is kv_bytes_allocated (docs/kv-cache.md#sliding-window-layers).
        needed = spec.kv_bytes_needed(args.tokens, bytes_per_value) * args.batch
        full_layers = spec.num_layers - spec.num_sliding_layers
        result.update({
            "sliding_window": spec.sliding_window,
            "sliding_layers": spec.num_sliding_layers,
            "bytes_per_token_past_window": full_layers * spec.kv_scalars_per_token_per_layer() * bytes_per_value,
            "kv_bytes_allocated": result["kv_bytes"],
            "kv_bytes": needed,
            "kv_gib": needed / GIB,
        })
    if args.json:
        print(json.dumps(result))
        return 0
    for key, value in result.items():
        if value is not None:
            print(f"{key}={value}")
    label = result["model"] or f"L={sizes['layers']} H_KV={sizes['kv_heads']} d_h={sizes['head_dim']}"
    if result.get("attention") == "mla":
        label += f" (MLA latent {result['kv_lora_rank']} + {result['qk_rope_head_dim']} per layer)"
    allocated = result.get("kv_bytes_allocated")
    note = "" if allocated is None else f"; a paged pool keeping every layer's positions allocates {allocated / GIB:.4g} GiB"
    print(f"# {label}: {args.batch} x {args.tokens} tokens at {args.dtype} -> "
          f"{result['kv_gib']:.4g} GiB ({result['kv_bytes']:,} bytes){note}")
    return 0


def _geometry(args: argparse.Namespace) -> dict:
    flags = {"--layers": args.layers, "--kv-heads": args.kv_heads, "--head-dim": args.head_dim}
    given = [flag for flag, value in flags.items() if value is not None]
    if args.model is not None:
        if given:
            raise ConfigError(f"--model replaces the geometry flags; drop {', '.join(given)}", where="kv-size")
        from simcore.presets import get_model

        model = get_model(args.model)
        return {"model": model.name, "layers": model.num_layers, "kv_heads": model.num_kv_heads,
                "head_dim": model.head_dim, "spec": model}
    missing = [flag for flag, value in flags.items() if value is None]
    if missing:
        raise ConfigError(f"give --model or all of --layers, --kv-heads, --head-dim; missing {', '.join(missing)}",
                          where="kv-size")
    return {"model": None, "layers": args.layers, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "spec": None}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, found {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, found {text!r}")
    return value
