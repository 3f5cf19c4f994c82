"""The trace shipped in workloads/data and the builtin: shortcut."""

from pathlib import Path

import pytest

from workloads.spec import build_requests, parse_workload
from workloads.traces.builtin import BUILTIN_TRACES


def test_builtin_azure_conv_2023_has_10000_requests_with_provenance():
    path = BUILTIN_TRACES["azure_conv_2023"]
    assert path.read_text().splitlines()[0] == "arrived_at,num_prefill_tokens,num_decode_tokens"
    assert "Splitwise" in (path.parent / "README.md").read_text()
    requests = build_requests(parse_workload({"trace": {"path": "builtin:azure_conv_2023"}}), seed=0,
                              base_dir=Path("/nonexistent"))
    assert len(requests) == 10_000
    first = requests[0]
    assert (first.arrival_s, first.prompt_len, first.output_len) == (0.0, 374, 44)
    assert requests[-1].arrival_s == 1787.309283


def test_reference_workload_lengths_with_poisson_arrivals():
    spec = parse_workload({
        "trace": {"path": "builtin:azure_conv_2023", "lengths_only": True},
        "arrivals": {"kind": "poisson", "rate": 4.0},
    })
    requests = build_requests(spec, seed=0, base_dir=Path("."))
    again = build_requests(spec, seed=0, base_dir=Path("."))
    assert [r.arrival_s for r in requests] == [r.arrival_s for r in again]
    duration = requests[-1].arrival_s
    assert 10_000 / duration == pytest.approx(4.0, rel=0.05)
    assert requests[1].prompt_len == 396
