"""Multi-step scheduling (`num_scheduler_steps`, vLLM 0.6): groups of steps planned by one
scheduler pass, outputs delivered in bursts, arrivals waiting for the group's end."""

from __future__ import annotations

import math

import pytest
import yaml

from backends.constant import ConstantCostModel
from backends.roofline import RooflineCostModel
from experiments.cli import main
from policies.accelerate import accelerator_for
from policies.registry import make_policy
from simcore.cluster import simulate
from simcore.engine import RunLimits
from simcore.metrics import request_frame
from simcore.plan import Decodes, StepPlan
from simcore.presets import get_hardware, get_model
from tests.helpers import SMALL_EXPERIMENT, req, run


def _gaps(itl) -> list[float]:  # noqa: ANN001 - an ItlLog
    """The log's gaps, one per output after a request's first, in the order added."""
    return [round(value, 9) for value, weight in zip(itl.values, itl.weights) for _ in range(weight)]


def test_decodes_come_in_bursts_of_the_group():
    # 10 ms a step. The prefill (whole prompts, alone) gives the first output at 10 ms; then a
    # group of 4 decode steps ends at 50 ms, where outputs 2-5 arrive together.
    policy, result = run([req(0, 0.0, prompt_len=8, output_len=5)], "continuous", num_scheduler_steps=4)
    row = request_frame(result.requests).iloc[0]
    assert row["ttft_s"] == pytest.approx(0.010)
    assert row["prefill_done_s"] == pytest.approx(0.010)
    assert row["e2el_s"] == pytest.approx(0.050)
    assert row["tpot_s"] == pytest.approx(0.040 / 4)  # the mean over the request is unchanged
    assert _gaps(policy.itl) == [0.04, 0.0, 0.0, 0.0]
    # Groups of 3: outputs 2-4 at 40 ms, then a new group whose first step gives the last at 50 ms.
    policy, result = run([req(0, 0.0, prompt_len=8, output_len=5)], "continuous", num_scheduler_steps=3)
    assert _gaps(policy.itl) == [0.03, 0.0, 0.0, 0.01]
    assert request_frame(result.requests).iloc[0]["e2el_s"] == pytest.approx(0.050)


def test_one_step_groups_are_plain_scheduling():
    requests = [req(i, 0.004 * i, prompt_len=20 + i, output_len=7 + i % 5) for i in range(12)]
    plain = request_frame(run(requests, "chunked_prefill", chunk_size=16)[1].requests)
    again = [req(i, 0.004 * i, prompt_len=20 + i, output_len=7 + i % 5) for i in range(12)]
    one = request_frame(run(again, "chunked_prefill", chunk_size=16, num_scheduler_steps=1)[1].requests)
    assert plain.equals(one)


def test_an_arrival_waits_for_the_group_to_end():
    # A decodes in a group from 10 to 50 ms; B arrives at 25 ms and is admitted when it ends.
    requests = [req(0, 0.0, prompt_len=8, output_len=10), req(1, 0.025, prompt_len=8, output_len=2)]
    _, result = run(requests, "continuous", num_scheduler_steps=4)
    frame = request_frame(result.requests).set_index("request_id")
    assert frame.loc[1, "first_scheduled_s"] == pytest.approx(0.050)
    assert frame.loc[1, "first_token_s"] == pytest.approx(0.060)
    # Scheduled every step, B starts with the next step after it arrives.
    requests = [req(0, 0.0, prompt_len=8, output_len=10), req(1, 0.025, prompt_len=8, output_len=2)]
    _, result = run(requests, "continuous")
    assert request_frame(result.requests).set_index("request_id").loc[1, "first_scheduled_s"] == pytest.approx(0.030)


def test_a_chunked_prompt_first_output_waits_for_the_group():
    # Chunked prefill: a step with a prompt starts a group too (vLLM gives it lookahead slots);
    # the prompt completes in its first step and decodes in the next three: four outputs at 40 ms.
    policy, result = run([req(0, 0.0, prompt_len=8, output_len=6)], "chunked_prefill", num_scheduler_steps=4)
    row = request_frame(result.requests).iloc[0]
    assert row["prefill_done_s"] == pytest.approx(0.010)
    assert row["ttft_s"] == pytest.approx(0.040)
    assert row["e2el_s"] == pytest.approx(0.060)
    assert _gaps(policy.itl) == [0.0, 0.0, 0.0, 0.02, 0.0]


def test_a_request_that_finishes_in_a_group_leaves_at_its_end():
    # B needs 2 outputs, A 10: B's last output is made at 30 ms (group step 1) but delivered,
    # and B released, when the group ends at 50 ms; A decodes on alone in the group meanwhile.
    requests = [req(0, 0.0, prompt_len=8, output_len=10), req(1, 0.0, prompt_len=8, output_len=2)]
    policy, result = run(requests, "continuous", num_scheduler_steps=4)
    frame = request_frame(result.requests).set_index("request_id")
    assert frame.loc[1, "finish_s"] == pytest.approx(0.050)
    assert frame.loc[1, "last_token_s"] == pytest.approx(0.050)
    assert list(result.steps.as_dict()["num_seqs"][:5]) == [2, 2, 1, 1, 1]


@pytest.mark.parametrize(("policy_name", "options"), [
    ("continuous", {}),
    ("chunked_prefill", {}),
    ("chunked_prefill", {"prefix_caching": True}),
    ("offload", {"num_host_blocks": 400}),
])
def test_memory_pressure_preemptions_and_invariants(policy_name, options):
    # Few blocks: groups end early rather than preempt in them; every request finishes with all
    # its outputs, block accounting checked after every step (with a prefix cache, with swaps).
    requests = [req(i, 0.002 * i, prompt_len=9 + 3 * i % 17, output_len=5 + 7 * i % 23) for i in range(40)]
    policy, result = run(requests, policy_name, num_blocks=40, num_scheduler_steps=8, **options)
    assert len(result.finished) == 40
    assert all(r.num_outputs == r.num_target_outputs for r in result.finished)
    assert sum(r.num_preemptions for r in result.finished) > 0
    assert policy.bm.num_used_blocks == 0


def test_horizon_in_a_group_reports_every_request_once():
    requests = [req(i, 0.001 * i, prompt_len=8, output_len=3 + i % 9) for i in range(30)]
    policy = make_policy("continuous", num_blocks=1000, block_size=4, num_scheduler_steps=8)
    result = simulate(requests, policy, ConstantCostModel(step_s=0.01),
                      limits=RunLimits(max_sim_time_s=0.095, check_invariants=True))
    assert result.end_reason == "max_sim_time"
    assert sorted(r.request_id for r in result.requests) == list(range(30))
    assert result.unfinished


def test_multi_step_policies_are_stepped():
    assert accelerator_for(make_policy("continuous", num_blocks=100, num_scheduler_steps=4)) is None
    assert accelerator_for(make_policy("continuous", num_blocks=100)) is not None


def test_later_steps_of_a_group_pay_no_overhead():
    roofline = RooflineCostModel(model=get_model("llama-3.1-8b"), hardware=get_hardware("h100-sxm"),
                                 step_overhead_s=2e-3, per_seq_overhead_s=1e-5)
    decodes = Decodes([0, 1, 2], [100, 200, 300], [50, 50, 50])
    scheduled, repeated = StepPlan(0, decodes=decodes), StepPlan(1, decodes=decodes, group_step=1)
    assert math.isclose(roofline.step_time(scheduled) - roofline.step_time(repeated), 2e-3 + 3 * 1e-5, rel_tol=1e-9)
    assert roofline.breakdown(repeated)["overhead_s"] == 0.0


def _experiment(tmp_path, **changes) -> str:  # noqa: ANN001
    data = {**SMALL_EXPERIMENT, "policies": [{"name": "continuous", "num_scheduler_steps": 4}], **changes}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_experiment_runs_multi_step(tmp_path):
    assert main(["run", _experiment(tmp_path), "--out", str(tmp_path / "out")]) == 0


@pytest.mark.parametrize(("changes", "message"), [
    ({"policies": [{"name": "continuous", "num_scheduler_steps": 0}]}, "num_scheduler_steps"),
    ({"policies": [{"name": "static", "num_scheduler_steps": 2}]}, "num_scheduler_steps"),
    ({"clients": {"timeout_s": 5.0}}, "policies[0].num_scheduler_steps: client timeouts"),
])
def test_bad_multi_step_settings_exit_2(tmp_path, capsys, changes, message):
    assert main(["run", _experiment(tmp_path, **changes), "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
