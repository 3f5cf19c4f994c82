"""`servesim calibrate PROFILE.csv --model M --hardware H`: fit the roofline to a measured profile.

Fits mfu, mbu, step_overhead_s and per_seq_overhead_s (backends/calibration.py), prints the
error before (the roofline's defaults) and after, overall and by step kind, and writes a YAML
calibration file an experiment names as `cost_model: {name: roofline, calibration: FILE}`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simcore.errors import ServesimError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", type=Path, help="profile table (CSV from `servesim profile`)")
    parser.add_argument("--model", required=True, help="preset name or path to a HF config.json (the profiled model)")
    parser.add_argument("--hardware", required=True, help="hardware preset whose peak FLOP/s and bandwidth mfu/mbu scale")
    parser.add_argument("--out", type=Path, default=None, help="calibration YAML to write (default: <profile>.calib.yaml)")
    parser.add_argument("--fit", default=",".join(("mfu", "mbu", "step_overhead_s", "per_seq_overhead_s")),
                        help="comma-separated parameters to fit; the others keep the roofline's defaults")
    parser.add_argument("--weight-dtype", default=None, help="weight dtype (default: the profile's dtype)")
    parser.add_argument("--kv-dtype", default=None, help="KV dtype (default: the profile's dtype)")
    parser.add_argument("--tensor-parallel", type=int, default=1,
                        help="GPUs the profiled model was split over (scales the per-GPU work and adds communication)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a roofline parameter kept fixed at this value, e.g. --set activation_rw_per_layer=20")


def run(args: argparse.Namespace) -> int:
    from backends.base import CostContext
    from backends.calibration import FITTABLE, fit_roofline, poor_fit_warnings, write_calibration
    from backends.profiled import check_geometry, read_profile
    from backends.roofline import make_roofline
    from simcore.model import DTYPE_BYTES
    from simcore.presets import get_model
    from simcore.validate import parse_yaml

    table = read_profile(args.profile)
    spec = get_model(args.model)
    profile_dtype = _dtype_name(table.header.get("dtype", "bf16"))
    weight_dtype = args.weight_dtype or profile_dtype
    kv_dtype = args.kv_dtype or profile_dtype
    for name in (weight_dtype, kv_dtype):
        if name not in DTYPE_BYTES:
            raise ServesimError(f"unknown dtype {name!r}; expected one of {sorted(DTYPE_BYTES)}")
    fit = tuple(p.strip() for p in args.fit.split(",") if p.strip())
    bad = [p for p in fit if p not in FITTABLE]
    if bad or not fit:
        raise ServesimError(f"--fit: expected a comma-separated subset of {list(FITTABLE)}, found {args.fit!r}")
    fixed = {}
    for item in args.overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ServesimError(f"--set expects KEY=VALUE, found {item!r}")
        fixed[key.strip()] = parse_yaml(raw, where=f"--set {key.strip()}")
    # The profile's activations are in its weights' dtype (the torch engine runs unquantized).
    ctx = CostContext(model=spec, hardware_name=args.hardware, kv_dtype_bytes=DTYPE_BYTES[kv_dtype],
                      weight_dtype_bytes=DTYPE_BYTES[weight_dtype], activation_dtype=weight_dtype,
                      tensor_parallel=args.tensor_parallel)
    check_geometry(table, ctx, str(args.profile))
    base = make_roofline(fixed, ctx)
    result = fit_roofline(base, table.rows, fit=fit)
    out = args.out or args.profile.with_suffix(".calib.yaml")
    write_calibration(out, result, model=spec.name, hardware=args.hardware, profile=str(args.profile),
                      profile_device=table.header.get("device"))
    print(f"calibrated the roofline for {spec.name} on {args.hardware} to {len(table.rows)} shapes of {args.profile}")
    print("  " + ", ".join(f"{k} {result.base_params[k]:.4g} -> {v:.4g}" for k, v in result.params.items()))
    print(format_error_table(result.before, result.after))
    warnings = poor_fit_warnings(result.after)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if warnings:
        # A lower error than before is not a usable model: say what to do instead.
        print("warning: the roofline's formula does not describe these steps well (see docs/fidelity.md, "
              "'Poor fits'); a profiled cost model (cost_model: {name: profiled, table: PROFILE}) follows "
              "the measured shapes instead", file=sys.stderr)
    print(f"wrote {out}")
    return 0


def format_error_table(before: dict, after: dict) -> str:
    lines = [f"  {'steps':8s} {'count':>5s}  {'median |err| before':>19s} {'after':>7s}  "
             f"{'p90 |err| before':>16s} {'after':>7s}"]
    for kind, b in before.items():
        a = after[kind]
        if not b.get("count"):
            continue
        lines.append(f"  {kind:8s} {b['count']:5d}  {b['median_abs_rel_error']:19.1%} {a['median_abs_rel_error']:7.1%}  "
                     f"{b['p90_abs_rel_error']:16.1%} {a['p90_abs_rel_error']:7.1%}")
    return "\n".join(lines)


def _dtype_name(torch_name: str) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(torch_name, torch_name)
