"""Every registered cost model prices a run of steps exactly as it prices each step.

A cost model needs only `step_time`; `simcore.pricing.run_step_times` builds a run's prices from
it, and a model may offer its own `run_step_times` as a faster way to the same numbers. Here
every model in the registry that offers one is checked against `step_time` on each step's plan,
bit for bit, on random runs: decodes, prompt chunks, a chunk that completes its prompt, repeats
that start some steps on (`advance`) and requests that left (`without`).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from backends.base import CostContext
from backends.registry import COST_MODELS, build_cost_model
from simcore.plan import Repeat, ScheduledSeq, StepPlan
from simcore.presets import get_model
from simcore.pricing import run_step_times

TABLE = Path(__file__).parent / "data" / "profiles" / "cpu-tiny-llama.csv"
# Parameters that build each registered model that the simulator runs without torch.
PARAMS = {
    "constant": {"step_s": 0.002, "per_token_s": 1e-5, "per_request_s": 3e-6},
    "roofline": {},
    "profiled": {"table": str(TABLE), "check_model": False},
}


def random_repeats(rng: random.Random) -> list[Repeat]:
    """A run's repeats as the accelerators make them: decodes beside at most one prompt's chunks
    (which select only in a repeat of one step: the chunk that completes the prompt)."""
    repeats = []
    for _ in range(rng.randint(1, 4)):
        num_steps = rng.randint(1, 12)
        seqs = []
        for request_id in range(rng.randint(0, 40)):
            prompt_len = rng.randint(1, 3000)
            seqs.append(ScheduledSeq(request_id, 1, prompt_len + rng.randint(0, 2000), True, prompt_len))
        if rng.random() < 0.6 or not seqs:
            chunk = rng.randint(2, 512)
            context = rng.randint(0, 4000)
            selects = rng.random() < 0.3
            if selects:
                num_steps = 1
            seqs.append(ScheduledSeq(1000, chunk, context, selects, context + chunk if selects else 10**6))
        without = tuple(sorted(rng.sample(range(len(seqs) - 1), rng.randint(0, len(seqs) - 1)))) \
            if len(seqs) > 1 and rng.random() < 0.4 else ()
        repeats.append(Repeat(StepPlan(rng.randint(0, 100), tuple(seqs)), num_steps, rng.randint(0, 5), without))
    return repeats


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_a_run_is_priced_as_its_steps(name):
    model = build_cost_model(name, PARAMS[name], CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    assert hasattr(model, "run_step_times"), f"{name} prices runs step by step: drop it from PARAMS' list of fast ones"
    rng = random.Random(name)
    for _ in range(300):
        repeats = random_repeats(rng)
        expected = [model.step_time(plan) for repeat in repeats for plan in repeat.plans()]
        assert list(run_step_times(model, repeats)) == expected


def test_every_registered_model_is_checked_or_prices_step_by_step():
    """A new cost model joins the check above; the real engine (which executes each step it
    prices) has no run pricing of its own."""
    assert set(COST_MODELS) == {*PARAMS, "torch"}
    pytest.importorskip("torch")
    from backends.torch.cost_model import TorchCostModel

    assert not hasattr(TorchCostModel, "run_step_times")


def test_a_model_with_step_time_only_is_priced_step_by_step():
    class Counting:
        def __init__(self) -> None:
            self.plans: list[StepPlan] = []

        def step_time(self, plan: StepPlan) -> float:
            self.plans.append(plan)
            return 0.001 * (1 + sum(seq.context_len for seq in plan.seqs))

    model = Counting()
    plan = StepPlan(7, (ScheduledSeq(1, 1, 10, True, 5), ScheduledSeq(2, 4, 3, False, 100)))
    times = list(run_step_times(model, [Repeat(plan, 3, 2, ()), Repeat(plan, 1, 0, (0,))]))
    assert [p.step_id for p in model.plans] == [9, 10, 11, 7]
    assert [[seq.context_len for seq in p.seqs] for p in model.plans] == [[12, 11], [13, 15], [14, 19], [3]]
    assert times == [0.001 * (1 + 23), 0.001 * (1 + 28), 0.001 * (1 + 33), 0.001 * 4]
