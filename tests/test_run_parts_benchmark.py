"""benchmarks/run_parts.py in a small mode: the parts it counts are the run's, by kind."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import run_parts  # noqa: E402


def test_parts_by_kind_add_up_to_the_run():
    figures = run_parts.survey(400, "chunked_prefill")
    by_kind = figures["by_kind"]
    parts = sum(row["parts"] for row in by_kind.values())
    steps_in_parts = sum(row["steps"] for row in by_kind.values())
    # Every part is applied once, each of its steps a step of the run (stepped steps are not in parts).
    assert 0 < parts <= figures["events"] - 400 + figures["next_part"]["parts"]
    assert 0 < steps_in_parts <= figures["steps"]
    # Chunked prefill puts a prompt's chunks beside the decodes: such parts carry decoders.
    assert any(kind.startswith("P") and row["decoders"] > 0 for kind, row in by_kind.items())
    assert figures["next_part"]["parts"] <= figures["next_part"]["plans"]


def test_part_kinds_spell_what_the_part_does():
    from policies.stretch import Stretch
    from tests.helpers import req

    prompt, decoder = req(0, 0.0, 8, 4), req(1, 0.0, 8, 4)
    part = Stretch(2, [decoder], [1], [3], 9, 3, prefill=prompt, chunk=4, tail=4, admits=True)
    assert run_parts.part_kind(part, 2) == "PaT2"
    assert run_parts.part_kind(part, 1) == "Pa1"  # cut before its last chunk
    assert run_parts.part_kind(Stretch(5, [decoder], [1], [3], 9, 6, remaining=[6]), 5) == "Dr+"
