"""`servesim validate FILE.yaml --out DIR`: the real engine against the cheaper cost models.

Runs the experiment's workload and policies with the torch engine executing every step, then
with each model named by --against (profiled, roofline), and compares end to end (latency
percentiles, throughput, per-request pairs) and per step (each model's price for the exact
plans the real run executed). See experiments/fidelity.py and docs/fidelity.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simcore.errors import ServesimError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", type=Path, help="experiment YAML file")
    parser.add_argument("--out", type=Path, required=True, help="results folder")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N for the real engine "
                        "(default: the experiment's torch section, else cuda when available)")
    parser.add_argument("--against", default=None,
                        help="comma-separated cheaper models: profiled, roofline "
                             "(default: both when a profile table is known, else roofline)")
    parser.add_argument("--profile", type=Path, default=None,
                        help="profile table for the profiled model (default: the experiment's cost_model.table)")
    parser.add_argument("--calibration", type=Path, default=None,
                        help="roofline calibration file from `servesim calibrate` (default: the experiment's, if any)")
    parser.add_argument("--engine", dest="engine_params", action="append", default=[], metavar="KEY=VALUE",
                        help="a torch engine parameter, e.g. --engine dtype=bf16 --engine cuda_graphs=true (repeatable; "
                             "dtype, attention and cuda_graphs default to the profile's)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: as the CPU profile was measured)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override an experiment field, e.g. --set workload.num_requests=20 (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="print only the report tables (no progress)")


def run(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        raise ServesimError("`servesim validate` runs the real engine and needs PyTorch "
                            "(pip install -e '.[torch]' in the servesim repository)") from None
    from experiments.config import load_experiment
    from experiments.fidelity import format_report, resolve_setup, run_validation
    from experiments.io import locked_folder
    from experiments.progress import RunProgress, progress_wanted
    from simcore.validate import parse_yaml

    exp = load_experiment(args.experiment, args.overrides)
    engine = {}
    for item in args.engine_params:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ServesimError(f"--engine expects KEY=VALUE, found {item!r}")
        engine[key.strip()] = parse_yaml(raw, where=f"--engine {key.strip()}")
    against = [a.strip() for a in args.against.split(",") if a.strip()] if args.against else None
    setup = resolve_setup(exp, source=args.experiment, device=args.device, against=against, profile=args.profile,
                          calibration=args.calibration, torch_params=engine)
    if args.threads:
        setup.torch_params["_threads"] = args.threads
    echo = None if args.quiet else (lambda line: print(line, file=sys.stderr))
    with locked_folder(args.out):
        result = run_validation(exp, setup, source=args.experiment, out_dir=args.out, echo=echo,
                                progress=RunProgress(progress_wanted(args.quiet)))
    print(format_report(result.report))
    print(f"results: {args.out} (fidelity.json, step_pairs.parquet, request_pairs.parquet, plots/)")
    return 0
