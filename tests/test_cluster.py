"""Replicas behind routers, and closed-loop clients (simcore.cluster, policies.routers)."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from policies.accelerate import accelerator_for
from policies.routers import ROUTERS, make_router
from simcore.cluster import ClosedLoopSpec, Replica, simulate, simulate_cluster
from simcore.engine import RunLimits
from simcore.metrics import request_frame
from tests.helpers import req
from tests.test_accelerate import CONFIGS, _expanded, cost_model, small_policy, workload

CLUSTER_CONFIGS = [("continuous", {}), ("chunked_prefill", {"chunk_size": 16}),
                   ("continuous", {"preemption": "swap"}), ("offload", {"chunk_size": 16})]


def cluster_run(requests, name, opts, *, router="round_robin", num_replicas=3, fast=True, caching=False,
                clients=None, delay_s=0.0, num_blocks=64, horizon=None, timeout_s=None):  # noqa: ANN001, ANN201
    replicas = []
    for _ in range(num_replicas):
        policy = small_policy(name, opts, caching=caching, num_blocks=num_blocks)
        replicas.append(Replica(policy, cost_model(), accelerator_for(policy) if fast else None))
    return simulate_cluster(requests, replicas, router=make_router(router, num_replicas, seed=3),
                            router_delay_s=delay_s, clients=clients, timeout_s=timeout_s,
                            limits=RunLimits(max_sim_time_s=horizon, check_invariants=True))


def tables(result) -> list:  # noqa: ANN001
    """Each replica's request and step tables and inter-token gaps, and the router's decisions."""
    out = [[request_frame(r.requests), pd.DataFrame(r.steps.as_dict()), _expanded(r.itl)] for r in result.replicas]
    return [out, result.decisions, result.sim_time_s, result.end_reason]


def assert_tables_equal(a: list, b: list) -> None:
    (replicas_a, *rest_a), (replicas_b, *rest_b) = a, b
    assert rest_a == rest_b
    for (requests_a, steps_a, gaps_a), (requests_b, steps_b, gaps_b) in zip(replicas_a, replicas_b):
        pd.testing.assert_frame_equal(requests_a, requests_b, check_exact=True)
        pd.testing.assert_frame_equal(steps_a, steps_b, check_exact=True)
        assert gaps_a == gaps_b


@pytest.mark.parametrize("router", sorted(ROUTERS))
@pytest.mark.parametrize("name, opts", CONFIGS[2:5] + CONFIGS[7:8])
def test_one_replica_cluster_is_the_single_engine_run(router, name, opts):
    requests = workload(1, content=True, sessions=True)
    policy = small_policy(name, opts, caching=True)
    single = simulate(requests, policy, cost_model(), accelerator=accelerator_for(policy),
                      limits=RunLimits(check_invariants=True))
    cluster = cluster_run(requests, name, opts, router=router, num_replicas=1, caching=True)
    (alone,) = cluster.replicas
    pd.testing.assert_frame_equal(request_frame(single.requests), request_frame(alone.requests), check_exact=True)
    pd.testing.assert_frame_equal(pd.DataFrame(single.steps.as_dict()), pd.DataFrame(alone.steps.as_dict()),
                                  check_exact=True)
    assert _expanded(single.itl) == _expanded(alone.itl)
    assert [d[1] for d in cluster.decisions] == [0] * len(requests)


@pytest.mark.parametrize("router", sorted(ROUTERS))
@pytest.mark.parametrize("name, opts", CLUSTER_CONFIGS)
def test_runs_match_stepping_in_a_cluster(router, name, opts):
    """Routers that read the replicas' state see it as stepping shows it, with runs or without."""
    requests = workload(2, content=True, sessions=True, num_requests=90, rate=60.0)
    stepped = cluster_run(requests, name, opts, router=router, fast=False, caching=True)
    fast = cluster_run(requests, name, opts, router=router, fast=True, caching=True)
    assert_tables_equal(tables(stepped), tables(fast))
    # Every request routed exactly once, and each in the results of the replica it went to.
    routed = {request_id: index for request_id, index, _ in fast.decisions}
    assert len(routed) == len(fast.decisions) == len(requests)
    for index, result in enumerate(fast.replicas):
        assert all(routed[r.request_id] == index for r in result.requests)
    assert sum(len(r.requests) for r in fast.replicas) == len(requests)


@pytest.mark.parametrize("name, opts, seed, num_requests, rate, router", [
    ("continuous", {}, 19, 67, 400.0, "power_of_two"),
    ("chunked_prefill", {"chunk_size": 64}, 149, 73, 60.0, "least_outstanding"),
])
def test_a_request_rejected_during_a_run_leaves_when_stepping_would_hand_it_over(name, opts, seed, num_requests,
                                                                                  rate, router):
    """A request the policy rejects (too long for 24 blocks), delivered while a run's steps are
    taken, leaves at the next step's start, as stepping hands it over then: routers that read
    the replicas' load see it gone from there, with runs or without (found by a random search)."""
    requests = workload(seed, content=name == "continuous", num_requests=num_requests, rate=rate)
    runs = [cluster_run(requests, name, opts, router=router, num_replicas=3 if name == "continuous" else 2,
                        num_blocks=24, fast=fast) for fast in (False, True)]
    assert sum(len(replica.rejected) for replica in runs[0].replicas) >= 3
    assert_tables_equal(*map(tables, runs))


def test_a_state_read_during_a_planned_step_leaves_it_alone_as_stepping_does():
    """A reader (a state-reading router, a client's timeout) that observes a replica while its
    planned step runs may change what the step after it does (a cancel frees a seat or the
    queue's head): the run is not taken then, as stepping plans that step (found by a random
    search: the engine asks for a run once the planned step has ended)."""
    requests = workload(601, content=False, num_requests=48, rate=400.0)
    runs = [tables(cluster_run(requests, "offload", {"chunk_size": 16}, router="prefix_aware", num_blocks=24,
                               delay_s=0.05, timeout_s=0.5, fast=fast)) for fast in (False, True)]
    assert_tables_equal(*runs)


def test_router_delay_and_horizon_match_stepping():
    requests = workload(4, content=False, num_requests=80, rate=50.0)
    runs = [tables(cluster_run(requests, "chunked_prefill", {"chunk_size": 16}, router="least_outstanding",
                               fast=fast, delay_s=0.003, horizon=1.0)) for fast in (False, True)]
    assert_tables_equal(*runs)
    result = cluster_run(requests, "chunked_prefill", {"chunk_size": 16}, router="least_outstanding", delay_s=0.003)
    for replica in result.replicas:
        for request in replica.finished:
            # The router's delay is in the time to first token: it reached the engine 3 ms late.
            assert request.first_scheduled_s >= request.arrival_s + 0.003 - 1e-12


def test_routers_spread_and_balance():
    requests = workload(5, content=False, num_requests=90, rate=60.0)
    counts = {}
    for router in ROUTERS:
        result = cluster_run(requests, "continuous", {}, router=router)
        counts[router] = [len(r.requests) for r in result.replicas]
    assert counts["round_robin"] == [30, 30, 30]
    assert all(min(c) > 0 for c in counts.values()), counts


def test_prefix_aware_routing_hits_more_than_round_robin():
    # Nine long shared prefixes, more than one replica's cache holds: routed by prefix, each
    # replica keeps its own few.
    rng = random.Random(6)
    prefixes = [tuple(rng.randrange(1000) for _ in range(48)) for _ in range(9)]
    requests = []
    for i in range(120):
        prompt = rng.choice(prefixes) + tuple(rng.randrange(1000) for _ in range(rng.randint(1, 8)))
        requests.append(req(i, i * 0.05, len(prompt), rng.randint(1, 10), prompt_token_ids=prompt))
    hits = {}
    for router in ("round_robin", "prefix_aware"):
        result = cluster_run(requests, "chunked_prefill", {"chunk_size": 16}, router=router, caching=True,
                             num_blocks=60)
        frame = pd.concat([request_frame(r.requests) for r in result.replicas])
        hits[router] = frame["num_prefix_hit_tokens"].sum() / frame["prompt_len"].sum()
    assert hits["prefix_aware"] > hits["round_robin"], hits


def test_prefix_aware_routing_hits_more_on_the_shipped_router_example():
    """experiments/examples/cluster_routers.yaml (50 sessions): prefix-aware routing keeps a
    conversation where its history is cached."""
    from pathlib import Path

    from experiments.config import load_experiment
    from experiments.runner import run_experiment

    path = Path(__file__).resolve().parent.parent / "experiments" / "examples" / "cluster_routers.yaml"
    hit_rates = {}
    for router in ("round_robin", "prefix_aware"):
        exp = load_experiment(path, ["workload.sessions.num_sessions=50", f"cluster.router.name={router}",
                                     "variants=null"])
        hit_rates[router] = run_experiment(exp, source=path).runs[0].summary["prefix_cache_hit_rate"]
    assert hit_rates["prefix_aware"] > hit_rates["round_robin"] + 0.05, hit_rates


@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("name, opts", CLUSTER_CONFIGS[:2])
def test_closed_loop_clients(concurrency, name, opts):
    requests = workload(7, content=False, num_requests=40)
    clients = ClosedLoopSpec(concurrency, think_time_s=0.02)
    runs = [cluster_run(requests, name, opts, num_replicas=1, fast=fast, clients=clients) for fast in (False, True)]
    assert_tables_equal(tables(runs[0]), tables(runs[1]))
    result = runs[1]
    assert result.max_concurrency == concurrency
    finished = sorted(result.replicas[0].finished, key=lambda r: r.arrival_s)
    assert len(finished) == 40
    # Never more requests out than clients: at each send, at most concurrency - 1 others out.
    for request in finished:
        out = sum(1 for other in finished if other.arrival_s <= request.arrival_s < other.finish_s)
        assert out <= concurrency
    if concurrency == 1:  # one client: each request is sent its think time after the last came back
        for before, after in zip(finished, finished[1:]):
            assert after.arrival_s == pytest.approx(before.finish_s + 0.02)


def test_closed_loop_clients_in_a_cluster_match_stepping():
    requests = workload(8, content=False, num_requests=60)
    clients = ClosedLoopSpec(6, think_time_s=0.01, think_time="exponential", seed=2)
    runs = [tables(cluster_run(requests, "chunked_prefill", {"chunk_size": 16}, router="least_kv", fast=fast,
                               clients=clients)) for fast in (False, True)]
    assert_tables_equal(*runs)


def test_a_timed_out_request_leaves_with_its_blocks_and_the_rest_go_on():
    """Constant 10 ms steps, one seat: a 100-output request given up after 0.5 s leaves then,
    holding nothing; the one behind it, waiting for the seat, runs from then and finishes."""
    from backends.constant import ConstantCostModel
    from policies.registry import make_policy

    requests = [req(0, 0.0, 40, 100), req(1, 0.1, 40, 5)]
    for fast in (False, True):
        policy = make_policy("continuous", num_blocks=64, block_size=4, max_num_seqs=1)
        replica = simulate(requests, policy, ConstantCostModel(step_s=0.01), timeout_s=0.5,
                           accelerator=accelerator_for(policy) if fast else None,
                           limits=RunLimits(check_invariants=True))
        (gave_up,) = replica.timed_out
        assert gave_up.request_id == 0 and gave_up.finish_s == 0.5 and gave_up.status.value == "timed_out"
        assert gave_up.num_outputs == 50  # a step every 10 ms from 0, the 50th started at 0.49
        (done,) = replica.finished
        assert done.request_id == 1 and done.first_scheduled_s == 0.5
        assert policy.bm.num_used_blocks == 0


@pytest.mark.parametrize("name, opts", CLUSTER_CONFIGS)
def test_timeouts_match_stepping(name, opts):
    """Requests given up while queued, running, swapped out or in the router's delay: runs of
    steps are cut where a timeout changes them, so results are stepping's."""
    requests = workload(2, content=True, sessions=True, num_requests=90, rate=60.0)
    runs = [cluster_run(requests, name, opts, router="least_outstanding", fast=fast, caching=True, delay_s=0.002,
                        num_blocks=40, timeout_s=0.3) for fast in (False, True)]
    assert_tables_equal(tables(runs[0]), tables(runs[1]))
    statuses = pd.concat([request_frame(r.requests) for r in runs[1].replicas])["status"].value_counts()
    assert statuses["timed_out"] > 0 and statuses["finished"] > 0, statuses


def test_a_frontend_delays_each_request_before_its_engine_sees_it():
    from backends.constant import ConstantCostModel
    from policies.registry import make_policy

    requests = [req(0, 0.0, 40, 3), req(1, 1.0, 40, 3)]
    ttfts = {}
    for frontend_s in (0.0, 0.005):
        policy = make_policy("continuous", num_blocks=64, block_size=4)
        result = simulate(requests, policy, ConstantCostModel(step_s=0.01), frontend_s=frontend_s,
                          limits=RunLimits(check_invariants=True))
        assert [r.first_scheduled_s for r in result.requests] == [0.0 + frontend_s, 1.0 + frontend_s]
        ttfts[frontend_s] = [r.first_token_s - r.arrival_s for r in result.requests]
    assert ttfts[0.005] == pytest.approx([t + 0.005 for t in ttfts[0.0]])
    # In a cluster, with timeouts, runs of steps or not: the same tables.
    many = workload(4, content=False, num_requests=80, rate=50.0)
    runs = []
    for fast in (False, True):
        replicas = [Replica(p := small_policy("chunked_prefill", {"chunk_size": 16}, caching=False), cost_model(),
                            accelerator_for(p) if fast else None) for _ in range(2)]
        runs.append(tables(simulate_cluster(many, replicas, router=make_router("least_outstanding", 2),
                                            frontend_s=0.004, timeout_s=0.4,
                                            limits=RunLimits(check_invariants=True))))
    assert_tables_equal(*runs)


def test_requests_given_up_in_the_routers_delay_count_on_their_replica():
    requests = workload(3, content=False, num_requests=12)
    result = cluster_run(requests, "continuous", {}, num_replicas=2, delay_s=0.5, timeout_s=0.2)
    for index, replica in enumerate(result.replicas):
        assert len(replica.timed_out) == 6 and not replica.finished and not replica.steps.as_dict()["step_id"].size
        assert all(r.finish_s == pytest.approx(r.arrival_s + 0.2) for r in replica.timed_out)
        assert sorted(r.request_id for r in replica.timed_out) == \
            sorted(d[0] for d in result.decisions if d[1] == index)


def test_a_closed_loop_client_sends_its_next_request_when_it_gives_up():
    requests = workload(7, content=False, num_requests=30)
    clients = ClosedLoopSpec(1)
    runs = [cluster_run(requests, "continuous", {}, num_replicas=1, fast=fast, clients=clients, timeout_s=0.05)
            for fast in (False, True)]
    assert_tables_equal(tables(runs[0]), tables(runs[1]))
    (replica,) = runs[1].replicas
    sent = sorted(replica.requests, key=lambda r: r.arrival_s)
    assert len(sent) == 30 and replica.timed_out
    for before, after in zip(sent, sent[1:]):
        # One client: the next goes when the last came back, finished or given up 50 ms after it went.
        assert after.arrival_s == before.finish_s
    for request in replica.timed_out:
        assert request.finish_s == pytest.approx(request.arrival_s + 0.05)


def test_summaries_leave_out_the_warm_up_and_cool_down(tmp_path):
    import json

    from simcore.metrics import measured_rows
    from tests.helpers import SMALL_EXPERIMENT
    from tests.test_cli_errors import write

    frame = pd.DataFrame({"request_id": [3, 0, 1, 2, 4], "arrival_s": [0.0, 0.5, 0.5, 0.2, 0.9]})
    # Sent in the order 3, 2, 0, 1, 4 (ties by id): one warm-up and two cool-down requests out.
    assert measured_rows(frame, 1, 2)["request_id"].tolist() == [0, 2]
    assert measured_rows(frame, 0, 0) is frame
    experiment = {**SMALL_EXPERIMENT, "workload": {**SMALL_EXPERIMENT["workload"], "num_requests": 40},
                  "clients": {"concurrency": 4, "timeout_s": 0.05},
                  "cluster": {"replicas": 2, "router": {"name": "least_outstanding"}}}
    summaries = {}
    for window in ((0, 0), (8, 4)):
        experiment["metrics"] = {"warmup_requests": window[0], "cooldown_requests": window[1]}
        out = tmp_path / f"out{window[0]}"
        from experiments.cli import main

        assert main(["run", str(write(tmp_path, experiment)), "--out", str(out), "--quiet"]) == 0
        summaries[window] = json.loads((out / "continuous" / "summary.json").read_text())
        assert len(pd.read_parquet(out / "continuous" / "requests.parquet")) == 40  # the table keeps all
    whole, windowed = summaries[(0, 0)], summaries[(8, 4)]
    assert whole["num_timed_out"] > 0 and "window" not in whole
    assert windowed["num_requests"] == 28 == windowed["window"]["num_measured"]
    assert sum(part["num_requests"] for part in windowed["replicas"]) == 28
    assert windowed["completed"] + windowed["num_timed_out"] == 28
    assert windowed["duration"] < whole["duration"]


def test_clients_refuse_sessions_and_bad_concurrency():
    with pytest.raises(ValueError, match="follow-up turns"):
        cluster_run(workload(1, content=False, sessions=True), "continuous", {}, num_replicas=1,
                    clients=ClosedLoopSpec(2))
    with pytest.raises(ValueError, match="at least 1 client"):
        cluster_run(workload(1, content=False), "continuous", {}, num_replicas=1, clients=ClosedLoopSpec(0))


def test_identical_replicas_at_n_times_the_rate_see_one_replicas_latencies():
    """Round robin over N identical replicas at N times one replica's rate: each replica sees
    about one replica's load, so its latency percentiles are the single run's (within noise).
    At a moderate load: round robin hands each replica every Nth arrival of a Poisson stream,
    which is steadier than a Poisson stream of its own, so near saturation its queues (and its
    TTFT tail) are shorter than the single engine's."""
    single = cluster_run(workload(9, content=False, num_requests=400, rate=4.0), "chunked_prefill",
                         {"chunk_size": 16}, num_replicas=1)
    cluster = cluster_run(workload(9, content=False, num_requests=1200, rate=12.0), "chunked_prefill",
                          {"chunk_size": 16}, num_replicas=3)
    one = request_frame(single.replicas[0].requests)
    for replica in cluster.replicas:
        frame = request_frame(replica.requests)
        for column in ("ttft_s", "tpot_s"):
            for q in (0.5, 0.9):
                expected, found = one[column].quantile(q), frame[column].quantile(q)
                assert found == pytest.approx(expected, rel=0.15), (column, q)


@pytest.mark.parametrize("change, fragments", [
    ({"cluster": {"replicas": 2, "router": {"name": "fastest"}}}, ("cluster.router.name", "unknown router 'fastest'")),
    ({"cluster": {"replicas": 0}}, ("cluster.replicas", "expected a whole number in [1, 256], found 0")),
    ({"cluster": {"replicas": 2, "router": {"name": "round_robin", "prefix_weight": 2}}},
     ("cluster.router", "prefix_weight is read only by the prefix_aware router")),
    ({"cluster": {"replicas": 2, "router": {"name": "random", "delay_ms": -1}}}, ("cluster.router.delay_ms",)),
    ({"clients": {"concurrency": 0}}, ("clients.concurrency", "found 0")),
    ({"clients": {"concurrency": 2, "think_time": "gamma"}}, ("clients.think_time",)),
    ({"clients": {"timeout_s": 0}}, ("clients.timeout_s", "found 0")),
    ({"cluster": {"replicas": 2, "groups": [{"replicas": 2}]}}, ("cluster", "give groups")),
    ({"cluster": {"replicas": 2, "prefill": {"hardware": "h200"}}}, ("cluster", "read only by a disaggregated")),
    ({"cluster": {"groups": [{"replicas": 1}, {"replicas": 1, "hardware": "h201"}]}},
     ("cluster.groups[1].hardware", "unknown hardware", "did you mean")),
    ({"cluster": {"groups": [{"replicas": 0}]}}, ("cluster.groups[0].replicas", "found 0")),
    ({"cluster": {"prefill_replicas": 1, "decode_replicas": 1, "decode": {"cost_model": {"name": "nope"}}},
      "policies": [{"name": "continuous"}]}, ("cluster.decode.cost_model.name", "unknown cost model")),
    ({"clients": {"concurrency": 2, "timeout_s": 5}, "cluster": {"groups": [{"replicas": 1}, {
        "replicas": 1, "cost_model": {"name": "roofline", "mfu": 2}}]}}, ("cluster.groups[1].cost_model", "mfu")),
    ({"metrics": {"warmup_requests": 3, "cooldown_requests": 2}},
     ("metrics.warmup_requests + metrics.cooldown_requests", "leave no request to measure")),
    ({"clients": {"think_time_s": 1.0}}, ("clients", "read only by closed-loop clients")),
    ({"clients": {"timeout_s": 5}, "cluster": {"prefill_replicas": 1, "decode_replicas": 1}},
     ("clients.timeout_s: client timeouts are not modelled in a disaggregated cluster",)),
])
def test_bad_cluster_and_clients_are_clear_errors(tmp_path, capsys, change, fragments):
    from tests.test_cli_errors import BASE, run_in_process, write

    run_in_process(capsys, str(write(tmp_path, {**BASE, **change})), "--out", str(tmp_path / "out"),
                   fragments=fragments)


def test_a_cluster_run_writes_replica_columns_and_summaries(tmp_path):
    import json

    import yaml

    from experiments.cli import main
    from tests.helpers import SMALL_EXPERIMENT

    exp = {**SMALL_EXPERIMENT, "workload": {**SMALL_EXPERIMENT["workload"], "num_requests": 30},
           "cluster": {"replicas": 3, "router": {"name": "least_outstanding", "delay_ms": 1}},
           "policies": [{"name": "continuous"}, {"name": "chunked_prefill"}]}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(exp))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    for entry in summary:
        assert entry["num_replicas"] == 3 and sum(entry["num_routed"]) == 30
        assert sum(part["completed"] for part in entry["replicas"]) == entry["completed"] == 30
        requests = pd.read_parquet(tmp_path / "out" / entry["label"] / "requests.parquet")
        steps = pd.read_parquet(tmp_path / "out" / entry["label"] / "steps.parquet")
        assert list(requests.columns[:2]) == ["request_id", "replica"]
        assert sorted(requests["replica"].value_counts().tolist()) == sorted(entry["num_routed"])
        assert list(steps.columns[:2]) == ["replica", "step_id"] and len(steps) == entry["num_steps"]
        routes = pd.read_parquet(tmp_path / "out" / entry["label"] / "routes.parquet")
        assert sorted(routes["request_id"]) == list(range(30)) and set(routes["phase"]) == {"serve"}
        assert (routes.set_index("request_id")["replica"] == requests.set_index("request_id")["replica"]).all()
    # The plots draw a cluster's load by replica (and not its steps' rows as one engine's).
    from experiments.report_plot import plot_results

    names = {path.name for path in plot_results(tmp_path / "out")}
    assert "replica_timeline.png" in names and "timeline.png" not in names


def test_replicas_that_differ(tmp_path):
    """Groups with no changes are the plain cluster; a group on faster hardware, or with fewer
    blocks, runs as such; a disaggregated cluster's sides take their own settings."""
    import json

    from experiments.cli import main
    from tests.helpers import SMALL_EXPERIMENT
    from tests.test_cli_errors import write

    base = {**SMALL_EXPERIMENT, "kv_cache": {"block_size": 16}, "cost_model": {"name": "roofline"},
            "workload": {**SMALL_EXPERIMENT["workload"], "num_requests": 60,
                         "arrivals": {"kind": "poisson", "rate": 30.0}}}

    def summary(cluster: dict) -> dict:
        out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
        assert main(["run", str(write(tmp_path, {**base, "cluster": cluster})), "--out", str(out), "--quiet"]) == 0
        return json.loads((out / "continuous" / "summary.json").read_text())

    plain = summary({"replicas": 3})
    grouped = summary({"groups": [{"replicas": 2}, {"replicas": 1, "tensor_parallel": 1}]})
    for key in ("mean_ttft_ms", "p99_tpot_ms", "num_steps", "duration"):
        assert plain[key] == grouped[key], key
    mixed = summary({"groups": [{"replicas": 1, "hardware": "h200"}, {"replicas": 1, "hardware": "l4",
                                                                       "kv_cache": {"num_blocks": 300}}]})
    fast, slow = mixed["replicas"]
    assert (fast["hardware"], slow["hardware"], slow["kv_num_blocks"]) == ("h200", "l4", 300)
    assert fast["kv_num_blocks"] > 300 and fast["mean_ttft_ms"] < slow["mean_ttft_ms"]
    split = summary({"prefill_replicas": 1, "decode_replicas": 1, "prefill": {"tensor_parallel": 2},
                     "decode": {"hardware": "h200"}})
    assert [(r["hardware"], r["tensor_parallel"]) for r in split["replicas"]] == [("h100-sxm", 2), ("h200", 1)]


def disaggregated_run(requests, name, opts, *, num_prefill=1, num_decode=2, fast=True, caching=False,
                      router="round_robin", decode_router="least_outstanding", concurrency=1, clients=None,
                      horizon=None, block_bytes=2_000_000, num_blocks=64):  # noqa: ANN001, ANN201
    from simcore.cluster import Disaggregation
    from simcore.presets import get_link

    replicas = []
    for _ in range(num_prefill + num_decode):
        policy = small_policy(name, opts, caching=caching, num_blocks=num_blocks)
        replicas.append(Replica(policy, cost_model(), accelerator_for(policy) if fast else None))
    spec = Disaggregation(num_prefill, make_router(decode_router, num_decode, seed=1), get_link("infiniband-ndr"),
                          block_bytes=block_bytes, link_concurrency=concurrency)
    return simulate_cluster(requests, replicas, router=make_router(router, num_prefill, seed=2), clients=clients,
                            disaggregation=spec, limits=RunLimits(max_sim_time_s=horizon, check_invariants=True))


@pytest.mark.parametrize("name, opts", CLUSTER_CONFIGS)
@pytest.mark.parametrize("decode_router", ["round_robin", "least_kv", "prefix_aware"])
def test_disaggregated_runs_match_stepping(name, opts, decode_router):
    requests = workload(10, content=True, sessions=True, num_requests=80, rate=60.0)
    runs = [disaggregated_run(requests, name, opts, fast=fast, caching=True, decode_router=decode_router)
            for fast in (False, True)]
    assert_tables_equal(tables(runs[0]), tables(runs[1]))
    assert runs[0].transfers == runs[1].transfers


def test_disaggregation_moves_each_request_once_after_its_prefill():
    requests = workload(11, content=False, num_requests=80, rate=80.0)
    result = disaggregated_run(requests, "chunked_prefill", {"chunk_size": 16}, num_prefill=2, num_decode=2,
                               router="least_outstanding")
    transfers = {t.request_id: t for t in result.transfers}
    multi = [r for r in requests if r.output_len > 1]
    assert sorted(transfers) == sorted(r.request_id for r in multi)
    decoded = {r.request_id: (index, r) for index, replica in enumerate(result.replicas[2:], 2)
               for r in replica.requests}
    for request_id, transfer in transfers.items():
        index, request = decoded[request_id]
        assert transfer.prefill_replica in (0, 1) and transfer.decode_replica == index
        # Never before its prefill ends; it waits for the link, then takes its time on it.
        assert request.prefill_done_s <= transfer.ready_s <= transfer.start_s < transfer.end_s
        assert request.first_token_s == transfer.end_s  # the first output is delivered when the KV arrives
        assert request.status.value == "finished" and request.num_outputs == request.output_len
    # Each request routed once per phase: a prefill decision for all, a decode one for those moved.
    phases = [index >= 2 for _, index, _ in result.decisions]
    assert phases.count(False) == len(requests) and phases.count(True) == len(multi)
    # The prefill side keeps (finished) only requests with a single output.
    kept = [r for replica in result.replicas[:2] for r in replica.requests]
    assert sorted(r.request_id for r in kept) == sorted(r.request_id for r in requests if r.output_len == 1)


def test_transfers_queue_on_a_busy_link():
    requests = [req(i, 0.0, 200, 5) for i in range(6)]
    for concurrency, expect_wait in ((1, True), (6, False)):
        # 50 blocks of 100 MB a request: 0.1 s a transfer at 50 GB/s, longer than a prefill step.
        result = disaggregated_run(requests, "chunked_prefill", {"chunk_size": 512}, concurrency=concurrency,
                                   block_bytes=100_000_000, num_blocks=400)
        waits = [t.start_s - t.ready_s for t in result.transfers]
        assert any(w > 0 for w in waits) == expect_wait, waits


def test_disaggregated_closed_loop_and_horizon_match_stepping():
    requests = workload(12, content=False, num_requests=60)
    clients = ClosedLoopSpec(5, think_time_s=0.01)
    runs = [tables(disaggregated_run(requests, "chunked_prefill", {"chunk_size": 16}, fast=fast, clients=clients,
                                     horizon=0.4)) for fast in (False, True)]
    assert_tables_equal(*runs)


def test_a_cluster_runs_the_real_engine(tmp_path):
    """Replicas of the torch cost model (each its own tiny model; their steps run one after
    another on the CPU): the run completes, with the same tokens a request gets alone."""
    pytest.importorskip("torch")
    import yaml

    from experiments.config import load_experiment
    from experiments.runner import run_experiment

    exp = {"name": "torch-cluster", "seed": 0, "model": "tiny-llama", "hardware": "cpu",
           "kv_cache": {"block_size": 16, "num_blocks": 40},
           "workload": {"num_requests": 8, "arrivals": {"kind": "poisson", "rate": 400.0},
                        "prompt_len": {"kind": "uniform", "low": 8, "high": 60},
                        "output_len": {"kind": "uniform", "low": 2, "high": 12}},
           "cost_model": {"name": "torch", "device": "cpu", "record_tokens": True, "warmup_rounds": 0},
           "policies": [{"name": "chunked_prefill", "chunk_size": 32, "max_num_batched_tokens": 64}],
           "output": {"plots": False}}
    frames = []
    for cluster in (None, {"replicas": 2, "router": {"name": "least_outstanding"}}):
        path = tmp_path / "exp.yaml"
        path.write_text(yaml.safe_dump({**exp, **({"cluster": cluster} if cluster else {})}))
        run = run_experiment(load_experiment(path), source=path)
        frames.append(run.runs[0].requests.set_index("request_id"))
    alone, clustered = frames
    assert (clustered["status"] == "finished").all() and sorted(clustered["replica"].unique()) == [0, 1]
    assert alone["output_token_ids"].map(list).equals(clustered["output_token_ids"].map(list))


def test_clients_with_sessions_are_a_clear_error(tmp_path, capsys):
    from tests.test_cli_errors import BASE, run_in_process, write

    sessions = {"arrivals": {"kind": "poisson", "rate": 1.0},
                "sessions": {"num_sessions": 3, "turns": {"kind": "uniform", "low": 2, "high": 3},
                             "think_time_s": {"kind": "fixed", "value": 1.0}, "message_len": {"kind": "fixed", "value": 10}},
                "prompt_len": {"kind": "fixed", "value": 20}, "output_len": {"kind": "fixed", "value": 5}}
    run_in_process(capsys, str(write(tmp_path, {**BASE, "workload": sessions, "clients": {"concurrency": 2}})),
                   "--out", str(tmp_path / "out"), fragments=("clients:", "follow-up turns"))
