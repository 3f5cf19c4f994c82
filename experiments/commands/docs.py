"""`servesim docs --out docs/`: regenerate docs/yaml-reference.md from the experiment schema."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("docs"), help="folder that receives yaml-reference.md")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the file in --out differs from the schema")


def run(args: argparse.Namespace) -> int:
    from experiments.docs_gen import generate, write

    if args.check:
        path = args.out / "yaml-reference.md"
        current = path.read_text() if path.is_file() else ""
        if current != generate():
            print(f"{path} is out of date: run `servesim docs --out {args.out}`")
            return 1
        print(f"{path} is current")
        return 0
    print(write(args.out))
    return 0
