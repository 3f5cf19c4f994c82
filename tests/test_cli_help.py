"""Every command's --help: each option explained, and a default shown once and only when it says something."""

from __future__ import annotations

import argparse
import re

import pytest

from experiments.cli import build_parser
from experiments.commands import COMMANDS


def _help(command: str) -> tuple[argparse.ArgumentParser, str]:
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return sub, " ".join(sub.format_help().split())  # unwrapped, so phrases do not break across lines


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_option_has_help_and_no_empty_default(command):
    parser, text = _help(command)
    undocumented = [a.option_strings or a.dest for a in parser._actions if not a.help]
    assert undocumented == []
    for noise in ("(default: None)", "(default: True)", "(default: False)", "(default: [])"):
        assert noise not in text
    # A help text that names its default gets no second one.
    assert not re.search(r"\(default[^)]*\) \(default", text)


def test_useful_defaults_are_still_shown():
    _, text = _help("capacity")
    assert "default 0.25" in text and "(default: local)" in text
    _, text = _help("run")
    assert text.count("(default: results/<experiment name>)") == 1


@pytest.mark.parametrize("command", ["run", "sweep", "capacity"])
def test_no_fast_forward_sets_the_limit_in_each_command_that_takes_it(command):
    from experiments.commands.arg_types import fast_forward_overrides

    required = ["--slo", "ttft_p90_ms=500"] if command == "capacity" else []
    parser = build_parser(command)
    plain = parser.parse_args([command, "exp.yaml", *required])
    stepping = parser.parse_args([command, "exp.yaml", *required, "--no-fast-forward"])
    assert fast_forward_overrides(plain) == []
    assert fast_forward_overrides(stepping) == ["limits.fast_forward=false"]
