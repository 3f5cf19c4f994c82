"""Every registered cost model prices a run of steps exactly as it prices each step.

A cost model needs only `step_time`; `simcore.pricing.repeat_times` builds a run's prices from
it, and a model may offer its own `repeat_times` as a faster way to the same numbers. Here
every model in the registry that offers one is checked against `step_time` on each step's plan,
bit for bit, on random runs: decodes (one by one or as columns), prompt chunks, a chunk that completes its prompt, repeats
that start some steps on (`advance`) and plans without requests that left (`StepPlan.without`).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from backends.base import CostContext
from backends.registry import COST_MODELS, build_cost_model
from simcore.plan import Decodes, Repeat, ScheduledSeq, StepPlan
from simcore.presets import get_hardware, get_model
from simcore.pricing import prices_repeats, repeat_times

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
        num_steps = rng.choice([rng.randint(1, 12), rng.randint(30, 300)])  # priced a step at a time, or in arrays
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
        plan = StepPlan(rng.randint(0, 100), tuple(seqs))
        decodes = [seq for seq in seqs if seq.num_new_tokens == 1]
        if decodes and rng.random() < 0.5:  # the decodes as columns (how policies plan a batch of them)
            plan = StepPlan(plan.step_id, tuple(seqs[len(decodes):]), decodes=Decodes(
                [seq.request_id for seq in decodes], [seq.context_len for seq in decodes],
                [seq.prompt_len for seq in decodes]))
        repeats.append(Repeat(plan.without(without) if without else plan, num_steps, rng.randint(0, 5)))
    return repeats


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_a_run_is_priced_as_its_steps(name):
    model = build_cost_model(name, PARAMS[name], CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm"))
    assert prices_repeats(type(model)), f"{name} prices runs step by step: drop it from PARAMS' list of fast ones"
    rng = random.Random(name)
    for _ in range(300):
        repeats = random_repeats(rng)
        expected = [model.step_time(plan) for repeat in repeats for plan in repeat.plans()]
        assert [float(t) for repeat in repeats for t in repeat_times(model, repeat)] == expected


@pytest.mark.parametrize("model_name, params, context", [
    # The overhead overlapping the device's work: it wins the max on small steps, loses on large.
    ("llama-3.1-8b", {"async_scheduling": True, "step_overhead_s": 0.004, "per_seq_overhead_s": 2e-5}, {}),
    ("llama-3.1-70b", {"collective_link": "nvlink-4"}, {"tensor_parallel": 4, "pipeline_parallel": 2,
                                                         "activation_dtype": "fp8", "weight_dtype_bytes": 1}),
    ("mixtral-8x7b", {}, {"tensor_parallel": 2}),  # the experts a step reads grow with its tokens
    ("gpt-oss-20b", {}, {}),  # sliding-window layers: priced a step at a time
])
def test_roofline_variants_price_runs_as_their_steps(model_name, params, context):
    ctx = CostContext(model=get_model(model_name), hardware_name="h100-sxm", **context)
    model = build_cost_model("roofline", params, ctx)
    rng = random.Random(model_name)
    for _ in range(60):
        repeats = random_repeats(rng)
        expected = [model.step_time(plan) for repeat in repeats for plan in repeat.plans()]
        assert [float(t) for repeat in repeats for t in repeat_times(model, repeat)] == expected


def test_async_scheduling_hides_the_overhead_behind_the_device():
    ctx = CostContext(model=get_model("llama-3.1-8b"), hardware_name="h100-sxm")
    serial = build_cost_model("roofline", {"step_overhead_s": 0.004}, ctx)
    overlapped = build_cost_model("roofline", {"step_overhead_s": 0.004, "async_scheduling": True}, ctx)
    for num_decodes in (1, 256):
        plan = StepPlan(0, tuple(ScheduledSeq(i, 1, 1000, True, 900) for i in range(num_decodes)))
        parts = serial.breakdown(plan)
        device = parts["dense_s"] + parts["attention_s"] + parts["comm_s"]
        assert serial.step_time(plan) == device + 0.004
        assert overlapped.step_time(plan) == max(device, 0.004)


def test_every_registered_model_is_checked_or_prices_step_by_step():
    """A new cost model joins the check above; the real engine (which executes each step it
    prices) has no run pricing of its own."""
    assert set(COST_MODELS) == {*PARAMS, "torch"}
    pytest.importorskip("torch")
    from backends.torch.cost_model import TorchCostModel

    assert not hasattr(TorchCostModel, "repeat_times")


def test_a_model_with_step_time_only_is_priced_step_by_step():
    class Counting:
        def __init__(self) -> None:
            self.plans: list[StepPlan] = []

        def step_time(self, plan: StepPlan) -> float:
            self.plans.append(plan)
            return 0.001 * (1 + sum(seq.context_len for seq in plan.seqs))

    model = Counting()
    plan = StepPlan(7, (ScheduledSeq(1, 1, 10, True, 5), ScheduledSeq(2, 4, 3, False, 100)))
    times = [t for repeat in [Repeat(plan, 3, 2), Repeat(plan.without((0,)), 1, 0)] for t in repeat_times(model, repeat)]
    assert [p.step_id for p in model.plans] == [9, 10, 11, 7]
    assert [[seq.context_len for seq in p.seqs] for p in model.plans] == [[12, 11], [13, 15], [14, 19], [3]]
    assert times == [0.001 * (1 + 23), 0.001 * (1 + 28), 0.001 * (1 + 33), 0.001 * 4]


def test_a_subclass_that_rewrites_step_time_is_priced_by_it():
    """A roofline with a step_time of its own is priced by that, not by the run pricing it
    inherits (which describes the roofline's step_time); one that writes both keeps its own."""
    from backends.roofline import RooflineCostModel

    class Slower(RooflineCostModel):
        def step_time(self, plan: StepPlan) -> float:
            return 2 * super().step_time(plan) + 1e-4

    class SlowerFast(Slower):
        def repeat_times(self, repeat: Repeat) -> list[float]:
            return [2 * time + 1e-4 for time in RooflineCostModel.repeat_times(self, repeat)]

    model = Slower(get_model("llama-3.1-8b"), get_hardware("h100-sxm"))
    assert not prices_repeats(Slower) and prices_repeats(SlowerFast) and prices_repeats(RooflineCostModel)
    rng = random.Random(5)
    for _ in range(50):
        for repeat in random_repeats(rng):
            expected = [model.step_time(plan) for plan in repeat.plans()]
            assert list(repeat_times(model, repeat)) == expected


def test_step_times_to_ticks_in_arrays_as_one_at_a_time():
    """The clock's rounding of a run's step times, in numpy arrays, equals its rounding of each
    (half to even, at least a tick), invalid ones named by index."""
    import numpy as np

    from simcore.clock import InvalidDuration, duration_ticks, durations_ticks

    rng = np.random.default_rng(0)
    seconds = np.concatenate([rng.random(500) * 0.1, [2.5e-12, 3.5e-12, 1e-15, 0.5e-12, 1e6]])
    expected = [duration_ticks(value) for value in seconds.tolist()]
    assert durations_ticks(seconds) == expected == durations_ticks(seconds.tolist())
    big = np.array([1e7, 2e9])  # past int64's ticks: counted one at a time, as Python ints
    assert durations_ticks(big) == [duration_ticks(1e7), duration_ticks(2e9)]
    huge = [1e293, 1e293]  # each counts, their sum overflows
    assert durations_ticks(huge) == [duration_ticks(1e293)] * 2
    for bad in ([0.1, 0.0], [0.1, float("nan")], [0.2, 0.1, -1.0], [float("inf")]):
        for form in (np.array(bad), bad):
            with pytest.raises(InvalidDuration) as caught:
                durations_ticks(form)
            assert caught.value.index == len(bad) - 1


def test_times_past_float_ticks_count():
    """A limit or arrival whose femtoseconds a float cannot hold (1e300 s) is still a tick count."""
    from simcore.clock import TICKS_PER_SECOND, to_ticks

    assert to_ticks(1e300) == int(1e300) * TICKS_PER_SECOND
    assert to_ticks(2.5) == 5 * TICKS_PER_SECOND // 2
