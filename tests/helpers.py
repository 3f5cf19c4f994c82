"""Small builders shared by tests."""

from __future__ import annotations

from backends.constant import ConstantCostModel
from policies.registry import make_policy
from simcore.cluster import simulate
from simcore.engine import RunLimits, RunResult
from simcore.request import Request


def req(request_id: int, arrival_s: float, prompt_len: int, output_len: int, **kw) -> Request:
    return Request(request_id=request_id, arrival_s=arrival_s, prompt_len=prompt_len, output_len=output_len, **kw)


def run(requests, policy_name: str, *, num_blocks: int = 1000, block_size: int = 4, cost=None, **options) -> tuple:
    policy = make_policy(policy_name, num_blocks=num_blocks, block_size=block_size, **options)
    cost = cost or ConstantCostModel(step_s=0.01)
    result: RunResult = simulate(requests, policy, cost, limits=RunLimits(check_invariants=True))
    return policy, result


def drive(policy, now: float = 0.0, step_s: float = 0.01):
    """One schedule/complete round by hand; returns (plan, time after the step)."""
    plan = policy.schedule(now)
    if plan is None:
        return None, now
    policy.complete(plan, now + step_s)
    policy.check()
    return plan, now + step_s


def small_example(path, num_requests: int) -> list[str]:  # noqa: ANN001 - a Path
    """`--set` overrides that run an example at `num_requests` requests: its warm-up and
    cool-down (metrics.warmup_requests, cooldown_requests), where it has them, shrink to a
    quarter of the run each."""
    import yaml

    overrides = [f"workload.num_requests={num_requests}"]
    metrics = (yaml.safe_load(path.read_text()) or {}).get("metrics") or {}
    for key in ("warmup_requests", "cooldown_requests"):
        if metrics.get(key):
            overrides.append(f"metrics.{key}={num_requests // 4}")
    return overrides


# A bound that tells a hang from slow work on a loaded machine (not a speed target): the fuzzers'
# per-example guard and the tests that work done on a huge input stays bounded.
HANG_S = 30.0


# A small valid experiment mapping for tests that mutate or break one field at a time.
SMALL_EXPERIMENT = {
    "name": "t",
    "model": "llama-3.1-8b",
    "hardware": "h100-sxm",
    "kv_cache": {"block_size": 16, "num_blocks": 64},
    "workload": {
        "num_requests": 5,
        "arrivals": {"kind": "poisson", "rate": 8.0},
        "prompt_len": {"kind": "uniform", "low": 10, "high": 100},
        "output_len": {"kind": "uniform", "low": 1, "high": 20},
    },
    "cost_model": {"name": "constant"},
    "policies": [{"name": "continuous"}],
    "output": {"plots": False},
}
