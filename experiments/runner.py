"""Run an experiment: build the workload once, simulate each policy on an identical copy of it."""

from __future__ import annotations

import dataclasses
import math
import platform
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from backends.base import CostContext
from backends.registry import build_cost_model
from experiments.config import Experiment, KVLinkConfig, policy_labels, resolve_max_model_len
from experiments.io import FORMAT_VERSION, atomic_write_text, path_under, write_json, write_table
from experiments.progress import RunProgress
from experiments.request_sink import RequestSink
from policies.accelerate import accelerator_for
from policies.registry import make_policy
from policies.routers import make_router
from simcore import __version__
from simcore.capacity import block_bytes, num_gpu_blocks
from simcore.cluster import (
    ClientsRefuseWorkload,
    ClosedLoopSpec,
    ClusterResult,
    ClusterSteps,
    Disaggregation,
    Replica,
    simulate_cluster,
)
from simcore.engine import RunLimits, RunResult
from simcore.errors import ConfigError
from simcore.hf_config import context_length
from simcore.itl import ItlLog
from simcore.metrics import add_token_columns, measured_rows, summarize_frame, token_columns_as_text
from simcore.model import DTYPE_BYTES, GIB, ModelSpec
from simcore.precision import WEIGHT_DTYPE_BYTES
from simcore.prefix import PrefixHasher
from simcore.presets import get_hardware, get_model
from simcore.request import Request
from workloads.spec import build_workload

# Most KV blocks a tier may have: block state is kept per block, so this bounds memory.
MAX_BLOCKS = 2**26
# Memory a run takes for each request: about 1.7 KB with one policy, and 0.35 KB more for each
# other policy (peak RSS of `servesim run` at 100k-1M requests, 2026-12-03). A workload whose
# estimate passes MEMORY_BUDGET (24 GiB machines, less what the KV state and Python take) is
# refused before it runs rather than end in a MemoryError or the OOM killer.
BYTES_PER_REQUEST, BYTES_PER_REQUEST_PER_POLICY = 1700, 350
MEMORY_BUDGET = 16 * GIB
# A run folder's summary of every policy, written after every other file of the run: its
# presence is what marks the folder complete (experiments.report_load reads folders by it).
RUN_COMPLETE = "summary.json"


@dataclass
class PolicyRun:
    label: str
    result: RunResult
    summary: dict
    # One row per request (requests.parquet), in request-id order.
    requests: pd.DataFrame


@dataclass
class ExperimentRun:
    experiment: Experiment
    runs: list[PolicyRun] = field(default_factory=list)
    info: dict = field(default_factory=dict)


def resolve_kv(exp: Experiment, *, source: str | None) -> dict:
    """Model, hardware and KV capacity facts every policy run shares."""
    model = get_model(exp.model, source=source)
    hardware = get_hardware(exp.hardware, source=source)
    kv_bytes = DTYPE_BYTES[exp.kv_cache.dtype]
    stages = exp.pipeline_parallel
    if model.num_layers % stages:
        raise ConfigError("pipeline stages must split the layers evenly", source=source, where="pipeline_parallel",
                          expected=f"a divisor of {model.name}'s {model.num_layers} layers", found=stages)
    # A GPU holds its stage's layers: 1/pp of each block (bytes it stores and its host link moves).
    bytes_per_block = block_bytes(model, exp.kv_cache.block_size, kv_bytes, exp.tensor_parallel, source=source,
                                  attention_data_parallel=exp.attention_data_parallel) // stages
    expert_bytes = expert_weight_bytes(exp, model, source=source)
    num_blocks = exp.kv_cache.num_blocks or num_gpu_blocks(
        model, hardware, block_size=exp.kv_cache.block_size, kv_dtype_bytes=kv_bytes,
        weight_dtype_bytes=WEIGHT_DTYPE_BYTES[exp.weight_dtype], expert_weight_dtype_bytes=expert_bytes,
        gpu_memory_utilization=exp.kv_cache.gpu_memory_utilization,
        tensor_parallel=exp.tensor_parallel, pipeline_parallel=stages, source=source,
        attention_data_parallel=exp.attention_data_parallel,
    )
    host_bytes = exp.kv_cache.host_memory_gib * GIB
    if not math.isfinite(host_bytes):  # past the float range (and inf // n is nan)
        raise ConfigError(
            f"{exp.kv_cache.host_memory_gib:g} GiB holds more KV blocks than servesim tracks ({MAX_BLOCKS:,}); "
            "use less memory", source=source, where="kv_cache.host_memory_gib",
        )
    num_host_blocks = int(host_bytes // bytes_per_block)
    for where, count in (("kv_cache.num_blocks", num_blocks), ("kv_cache.host_memory_gib", num_host_blocks)):
        if count > MAX_BLOCKS:
            raise ConfigError(
                f"{count:,} KV blocks is more than servesim tracks ({MAX_BLOCKS:,}); "
                "use a larger kv_cache.block_size or less memory", source=source, where=where,
            )
    return {
        "model": model, "hardware": hardware, "kv_dtype_bytes": kv_bytes, "block_bytes": bytes_per_block,
        "num_blocks": num_blocks, "num_host_blocks": num_host_blocks, "expert_weight_dtype_bytes": expert_bytes,
    }


def expert_weight_bytes(exp: Experiment, model: ModelSpec, *, source: str | Path | None) -> float | None:
    """Bytes per routed-expert weight: the experiment's expert_weight_dtype, else the checkpoint's
    (ModelSpec.expert_weight_dtype, e.g. gpt-oss's mxfp4); None: as weight_dtype. A model without
    routed experts refuses expert_weight_dtype."""
    if exp.expert_weight_dtype is not None and not model.is_moe:
        raise ConfigError("the model has no routed experts", source=str(source) if source is not None else None,
                          where="expert_weight_dtype", expected="unset for a dense model",
                          found=exp.expert_weight_dtype)
    dtype = exp.expert_weight_dtype or (model.expert_weight_dtype if model.is_moe else None)
    return None if dtype is None else WEIGHT_DTYPE_BYTES[dtype]


def cost_context(exp: Experiment, kv: dict, source: str | Path | None) -> CostContext:
    """What the experiment's cost models are built with (`kv` from resolve_kv)."""
    return CostContext(
        model=kv["model"], hardware_name=kv["hardware"].name, hardware=kv["hardware"], kv_dtype_bytes=kv["kv_dtype_bytes"],
        weight_dtype_bytes=WEIGHT_DTYPE_BYTES[exp.weight_dtype],
        expert_weight_dtype_bytes=kv["expert_weight_dtype_bytes"],
        activation_dtype=exp.compute_dtype_on(kv["hardware"]),
        block_size=exp.kv_cache.block_size, num_blocks=kv["num_blocks"], num_host_blocks=kv["num_host_blocks"],
        tensor_parallel=exp.tensor_parallel, pipeline_parallel=exp.pipeline_parallel,
        attention_data_parallel=exp.attention_data_parallel, seed=exp.seed, source=Path(source) if source is not None else None,
    )


def _check_memory(num_requests: int, num_policies: int, *, source: str | None) -> None:
    """Refuse a workload the run's memory estimate (BYTES_PER_REQUEST...) puts past MEMORY_BUDGET."""
    need = num_requests * (BYTES_PER_REQUEST + BYTES_PER_REQUEST_PER_POLICY * (num_policies - 1))
    if need > MEMORY_BUDGET:
        most = MEMORY_BUDGET // (BYTES_PER_REQUEST + BYTES_PER_REQUEST_PER_POLICY * (num_policies - 1))
        raise ConfigError(
            f"{num_requests:,} requests for {num_policies} policies would take about {need / GIB:.0f} GiB "
            f"(more than the {MEMORY_BUDGET / GIB:.0f} GiB servesim allows a run); split the policies "
            "into several experiments or use fewer requests", source=source, where="workload",
            expected=f"at most {most:,} requests for {num_policies} policies",
        )


def run_experiment(
    exp: Experiment,
    *,
    source: str | Path | None = None,
    out_dir: Path | None = None,
    echo=None,  # noqa: ANN001 - callable printing progress lines, or None
    progress: RunProgress | None = None,
    wrap_cost_model=None,  # noqa: ANN001 - callable(CostModel) -> CostModel, e.g. to record plans
    fast_forward: bool | None = None,
) -> ExperimentRun:
    """Simulate every policy of `exp` on one workload; with `out_dir`, write the results there.
    `fast_forward` overrides the experiment's `limits.fast_forward` (runs of steps taken at
    once by `policies.accelerate`; identical results either way)."""
    source_str = str(source) if source is not None else None
    base_dir = Path(source).parent if source is not None else Path.cwd()
    kv = resolve_kv(exp, source=source_str)
    workload = build_workload(exp.workload, seed=exp.seed, base_dir=base_dir, source=source_str)
    template = workload.requests
    _check_memory(len(template), len(exp.policies), source=source_str)
    num_left_out = exp.metrics.warmup_requests + exp.metrics.cooldown_requests
    if num_left_out and num_left_out >= len(template):
        raise ConfigError("the warm-up and cool-down leave no request to measure", source=source_str,
                          where="metrics.warmup_requests + metrics.cooldown_requests",
                          expected=f"fewer than the workload's {len(template)} requests", found=num_left_out)
    labels = policy_labels(exp.policies)
    run = ExperimentRun(exp, info=_run_info(exp, kv, len(template)))
    # What the workload builder dropped or estimated is said, never silent.
    run.info["workload_notes"] = list(workload.notes)
    hasher = PrefixHasher(exp.kv_cache.block_size, config_key=(exp.model, exp.kv_cache.dtype))
    caching_by_policy = [exp.kv_cache.prefix_caching if p.prefix_caching is None else p.prefix_caching
                         for p in exp.policies]
    # Requests of lengths alone (most traces) carry no token content, so no prefix can hit (nor
    # spill to a host tier): a prefix cache asked for then changes nothing but the lookups
    # counted, and where a real engine does not read block ids the policy runs on block counts
    # and every fast path (identical results, tested; several times faster).
    cache_cannot_hit = any(caching_by_policy) and not any(map(hasher.has_content, template))
    if cache_cannot_hit:
        run.info["workload_notes"].append(
            "no request carries token content (prompt_token_ids or segments), so the prefix cache "
            "cannot hit: its lookups are counted, and blocks are only counted")
    if echo is not None:
        for note in workload.notes:
            echo(f"  workload: {note}")
    ctx = cost_context(exp, kv, source)
    # Checked for every policy before any runs, so a bad value fails fast.
    max_model_lens = [
        resolve_max_model_len(p.max_model_len, kv["model"], where=f"policies[{i}].max_model_len", source=source_str)
        for i, p in enumerate(exp.policies)
    ]
    limits = RunLimits(exp.limits.max_sim_time_s, exp.limits.max_wall_time_s, exp.limits.check_invariants)
    if fast_forward is None:
        fast_forward = exp.limits.fast_forward
    if out_dir is not None:
        # An earlier run's summary goes before this run writes anything: until its own is written,
        # last, the folder reads as incomplete rather than as old results over half-new files.
        path_under(out_dir, RUN_COMPLETE).unlink(missing_ok=True)
    num_replicas = exp.cluster.num_replicas if exp.cluster is not None else 1
    setups = _replica_setups(exp, ReplicaSetup(exp, kv, ctx), source)
    clients = None
    if exp.clients is not None and exp.clients.concurrency is not None:
        clients = ClosedLoopSpec(exp.clients.concurrency, exp.clients.think_time_s, exp.clients.think_time, exp.seed)
        run.info["workload_notes"].append(
            f"closed loop: {exp.clients.concurrency} clients send the requests in order, each its next one "
            "when its last came back; the workload's arrival times are not read")
    timeout_s = exp.clients.timeout_s if exp.clients is not None else None
    if timeout_s is not None:
        run.info["workload_notes"].append(
            f"clients give up on a request not finished {timeout_s:g} s after they sent it (timed_out)")
    for index, (label, policy_cfg) in enumerate(zip(labels, exp.policies)):
        options = policy_cfg.model_dump(exclude={"label", "name", "prefix_caching"})
        options["max_model_len"] = max_model_lens[index]
        caching = caching_by_policy[index]
        started = time.perf_counter()
        policy_dir = path_under(out_dir, label) if out_dir is not None else None
        replicas, sinks, recorded = [], [], []
        for setup in setups:
            try:
                cost_model = build_cost_model(setup.exp.cost_model.name, setup.exp.cost_model.params, setup.ctx)
            except ConfigError as exc:
                raise _in_changes(exc, setup.changes) from None
            # A cost model that ran a real engine may keep the tokens it selected (torch's
            # record_tokens): read from the model itself, as a wrapper need not pass the hook on.
            recorded.append(getattr(cost_model, "recorded_tokens", None))
            if wrap_cost_model is not None:
                cost_model = wrap_cost_model(cost_model)
            emit_block_tables = getattr(cost_model, "needs_block_tables", False)
            inert_cache = caching and cache_cannot_hit and not emit_block_tables
            policy = _make_policy(
                label, source_str, policy_cfg.name, num_blocks=setup.kv["num_blocks"],
                block_size=exp.kv_cache.block_size, prefix_caching=caching and not inert_cache,
                num_host_blocks=setup.kv["num_host_blocks"], hasher=hasher,
                emit_block_tables=emit_block_tables, block_bytes=setup.kv["block_bytes"],
                delivery_s=exp.metrics.delivery_ms / 1000.0, **options,
            )
            if inert_cache:
                policy.counts_prefix_queries = True
            sinks.append(RequestSink())
            spill = None
            if policy_dir is not None and exp.output.format == "parquet" and num_replicas == 1:
                policy_dir.mkdir(parents=True, exist_ok=True)
                spill = policy_dir / ".steps.parquet.partial"
            replicas.append(Replica(policy, cost_model, accelerator_for(policy) if fast_forward else None,
                                    on_finished=sinks[-1].add, steps_spill=spill))
        # (Progress counts the cluster's finished requests through the first replica's engine.)
        replicas[0].on_progress = progress.policy(label, len(template)) if progress is not None else None
        router, disaggregation = _cluster_routing(exp, tuple(setup.kv["block_bytes"] for setup in setups))
        try:
            cluster = simulate_cluster(template, replicas, router=router, limits=limits, clients=clients,
                                       router_delay_s=exp.cluster.router.delay_ms / 1000.0 if exp.cluster else 0.0,
                                       disaggregation=disaggregation, timeout_s=timeout_s,
                                       frontend_s=exp.metrics.frontend_ms / 1000.0)
        except ClientsRefuseWorkload as exc:
            raise ConfigError(str(exc), source=source_str, where="clients",
                              expected="a workload without follow-up turns") from None
        finally:
            if progress is not None:
                progress.close()  # before the policy's line is echoed
        frames = []
        moved = {transfer.request_id: transfer for transfer in cluster.transfers}
        num_prefill = disaggregation.num_prefill if disaggregation is not None else 0
        for replica_index, (sink, result) in enumerate(zip(sinks, cluster.replicas)):
            sink.add([*result.finished, *result.rejected, *result.timed_out, *result.unfinished])
            frame = sink.frame()
            if replica_index < num_prefill:  # a request is in the table of the replica it ended on
                frame = frame[~frame["request_id"].isin(list(moved))].reset_index(drop=True)
            tokens = recorded[replica_index]
            if tokens is not None and (outputs := tokens()) is not None:
                prompts = {r.request_id: r.prompt_token_ids for r in template if r.prompt_token_ids is not None}
                add_token_columns(frame, outputs, prompts)
            if exp.cluster is not None:
                frame.insert(1, "replica", replica_index)
            if disaggregation is not None:
                _add_transfer_columns(frame, moved)
            frames.append(frame)
        frame = frames[0] if len(frames) == 1 else \
            pd.concat(frames, ignore_index=True).sort_values("request_id", kind="stable", ignore_index=True)
        result = cluster.replicas[0] if num_replicas == 1 else _cluster_result(cluster)
        policy = replicas[0].policy
        if limits.check_invariants:
            _check_conservation(frame, template)
        slo_ms = exp.metrics.slo.as_dict() or None
        # The summaries measure the requests past the warm-up and before the cool-down.
        measured = measured_rows(frame, exp.metrics.warmup_requests, exp.metrics.cooldown_requests)
        if exp.cluster is None:
            summary = summarize_frame(measured, itl=result.itl, slo_ms=slo_ms,
                                      extra=_policy_extra(policy, result, frame))
        else:
            extras = [_policy_extra(replica.policy, replica_result, part)
                      for replica, replica_result, part in zip(replicas, cluster.replicas, frames)]
            summary = summarize_frame(measured, itl=result.itl, slo_ms=slo_ms,
                                      extra=_cluster_extra(extras, cluster, frame, disaggregation))
            measured_ids = measured["request_id"]
            summary["replicas"] = [
                summarize_frame(part if measured is frame else part[part["request_id"].isin(measured_ids)],
                                itl=replica_result.itl, slo_ms=slo_ms,
                                extra={**extra, "hardware": setup.kv["hardware"].name,
                                       "tensor_parallel": setup.exp.tensor_parallel,
                                       "kv_num_blocks": setup.kv["num_blocks"]})
                for replica_result, part, extra, setup in zip(cluster.replicas, frames, extras, setups)]
        if measured is not frame:
            summary["window"] = {
                "warmup_requests": exp.metrics.warmup_requests, "cooldown_requests": exp.metrics.cooldown_requests,
                "num_measured": len(measured),
                # (The inter-token gaps are kept by step, not by request: they cannot be told apart.)
                "itl": "over every request's gaps, the warm-up's and cool-down's too",
            }
        if cluster.max_concurrency is not None:
            summary["max_concurrency"] = cluster.max_concurrency
        summary = {"label": label, "policy": policy_cfg.name, **summary}
        run.runs.append(PolicyRun(label, result, summary, frame))
        if echo is not None:
            echo(f"  {label}: {summary['completed']} finished, {len(result.steps)} steps, "
                 f"{result.sim_time_s:.1f} s simulated in {result.wall_time_s:.2f} s "
                 f"({time.perf_counter() - started:.2f} s with metrics)")
        if policy_dir is not None:
            # CSV has no list cells: token lists go as JSON text there.
            written = frame if exp.output.format == "parquet" else token_columns_as_text(frame)
            if exp.cluster is not None:  # the router's decisions (before summary.json, written last)
                routes = pd.DataFrame(cluster.decisions, columns=["request_id", "replica", "time_s"])
                routes.insert(2, "phase", "serve" if disaggregation is None else
                              ["decode" if index >= num_prefill else "prefill" for index in routes["replica"]])
                write_table(routes, path_under(policy_dir, "routes"), exp.output.format)
            write_policy_results(policy_dir, written, result, summary, exp.output.format)
    if out_dir is not None:
        write_experiment_files(out_dir, run)
    return run


def _check_conservation(frame: pd.DataFrame, template: list[Request]) -> None:
    """Every request that arrived is reported exactly once: finished, rejected, timed out or unfinished."""
    ids = frame["request_id"].to_numpy()
    if len(ids) != len(template) or len(set(ids.tolist())) != len(ids):
        raise AssertionError(f"{len(template)} requests in the workload, {len(ids)} rows ({len(set(ids.tolist()))} ids)")


def _make_policy(label: str, source: str | None, name: str, **kwargs):  # noqa: ANN003, ANN202
    try:
        return make_policy(name, **kwargs)
    except ValueError as exc:
        raise ConfigError(str(exc), source=source, where=f"policies[{label}]") from None


def _policy_extra(policy, result: RunResult, frame: pd.DataFrame) -> dict:  # noqa: ANN001
    return {
        "end_reason": result.end_reason,
        "num_steps": len(result.steps),
        "sim_time_s": result.sim_time_s,
        "num_preemptions_recompute": policy.tally.preemptions["recompute"],
        "num_preemptions_swap": policy.tally.preemptions["swap"],
        "bytes_swapped_out": policy.tally.blocks_swapped_out * policy.block_bytes,
        "bytes_swapped_in": policy.tally.blocks_swapped_in * policy.block_bytes,
        "transfer_time_s": result.steps.extra_totals.get("transfer_s", 0.0),
        "num_host_prefix_hit_blocks": policy.tally.host_prefix_hit_blocks,
        "mean_swap_delay_ms": _mean_ms(frame.loc[frame["num_swaps"] > 0, "swap_delay_s"]),
        "mean_recompute_delay_ms": _mean_ms(frame.loc[frame["num_recomputed_tokens"] > 0, "recompute_delay_s"]),
        "num_prefix_evictions": policy.bm.num_evictions,
    }


@dataclass(frozen=True)
class ReplicaSetup:
    """A replica's experiment (the cluster's own, or with its group's or side's changes), its KV
    facts (`resolve_kv`) and its cost models' context; `changes`: where its changes are
    (cluster.groups[i], cluster.prefill or cluster.decode; None: none)."""

    exp: Experiment
    kv: dict
    ctx: CostContext
    changes: str | None = None


def _in_changes(exc: ConfigError, changes: str | None) -> ConfigError:
    """`exc` naming its field as a replica's changes give it (cluster.groups[1].hardware)."""
    if changes is None:
        return exc
    text = str(exc)
    if exc.where:
        text = text.replace(f"{exc.where}: ", f"{changes}.{exc.where}: ", 1)
    return ConfigError(text if changes in text else f"{changes}: {text}")


def _replica_setups(exp: Experiment, own: ReplicaSetup, source: str | Path | None) -> list[ReplicaSetup]:
    """Each replica's setup, in replica order; replicas of one kind share theirs."""
    if exp.cluster is None:
        return [own]
    setups: dict[int, ReplicaSetup] = {}
    out = []
    for change in exp.cluster.replica_settings():
        if change is None:
            out.append(own)
            continue
        if id(change) not in setups:
            variant, changes = change.applied_to(exp), _replica_kind(exp, change)
            try:
                kv = resolve_kv(variant, source=str(source) if source is not None else None)
            except ConfigError as exc:
                raise _in_changes(exc, changes) from None
            setups[id(change)] = ReplicaSetup(variant, kv, cost_context(variant, kv, source), changes)
        out.append(setups[id(change)])
    return out


def _replica_kind(exp: Experiment, change: object) -> str:
    """Where in the experiment a replica's changes are: cluster.groups[i], cluster.prefill or cluster.decode."""
    cluster = exp.cluster
    assert cluster is not None
    if cluster.groups is not None:
        return f"cluster.groups[{next(i for i, group in enumerate(cluster.groups) if group is change)}]"
    return "cluster.prefill" if change is cluster.prefill else "cluster.decode"


def _cluster_routing(exp: Experiment, block_bytes: tuple[int, ...]) -> tuple:
    """The experiment's router, and its disaggregation (None where the cluster has none);
    `block_bytes` is each replica's."""
    if exp.cluster is None:
        return None, None
    cluster = exp.cluster
    if not cluster.disaggregated:
        return make_router(cluster.router.name, cluster.num_replicas, seed=exp.seed, **cluster.router.params()), None
    decode = cluster.decode_router or cluster.router
    router = make_router(cluster.router.name, cluster.prefill_replicas, seed=exp.seed, **cluster.router.params())
    link = cluster.link or KVLinkConfig()
    return router, Disaggregation(
        cluster.prefill_replicas, make_router(decode.name, cluster.decode_replicas, seed=exp.seed + 1, **decode.params()),
        link.spec(), block_bytes[:cluster.prefill_replicas], link.concurrency)


def _add_transfer_columns(frame: pd.DataFrame, moved: dict) -> None:
    """Where each request was prefilled, and its KV transfer's wait for the link and time on it
    (seconds; empty for requests that did not move)."""
    transfers = [moved.get(request_id) for request_id in frame["request_id"]]
    frame["prefill_replica"] = pd.array([t.prefill_replica if t else None for t in transfers], dtype="Int64")
    frame["transfer_wait_s"] = [t.start_s - t.ready_s if t else float("nan") for t in transfers]
    frame["transfer_s"] = [t.end_s - t.start_s if t else float("nan") for t in transfers]


def _cluster_result(cluster: ClusterResult) -> RunResult:
    """The replicas' results read as one run's (their requests are in the sinks already)."""
    results = cluster.replicas
    return RunResult(finished=[], rejected=[], unfinished=[], steps=ClusterSteps([r.steps for r in results]),
                     end_reason=cluster.end_reason, sim_time_s=cluster.sim_time_s, wall_time_s=cluster.wall_time_s,
                     num_events=sum(r.num_events for r in results), itl=ItlLog.merged([r.itl for r in results]))


def _cluster_extra(parts: list[dict], cluster: ClusterResult, frame: pd.DataFrame,
                   disaggregation: Disaggregation | None) -> dict:
    """A cluster's totals from its replicas' own (`_policy_extra`): counts added up, times and
    means by the whole request table."""
    totals = {name: sum(part[name] for part in parts) for name in parts[0]
              if all(isinstance(part[name], int) for part in parts)}
    num_routed = Counter(index for _, index, _ in cluster.decisions)
    return {
        **totals, "end_reason": cluster.end_reason, "sim_time_s": cluster.sim_time_s,
        "num_replicas": len(parts),
        "num_routed": [num_routed[index] for index in range(len(parts))],
        "transfer_time_s": sum(part["transfer_time_s"] for part in parts),
        **(_kv_transfer_summary(cluster, disaggregation) if disaggregation is not None else {}),
        "mean_swap_delay_ms": _mean_ms(frame.loc[frame["num_swaps"] > 0, "swap_delay_s"]),
        "mean_recompute_delay_ms": _mean_ms(frame.loc[frame["num_recomputed_tokens"] > 0, "recompute_delay_s"]),
    }


def _kv_transfer_summary(cluster: ClusterResult, disaggregation: Disaggregation) -> dict:
    """A disaggregated cluster's KV transfers: how many, what they moved, their wait for the
    link and time on it, and each prefill replica's link utilisation (time carrying transfers
    over the run's time, for each of the link's concurrent transfers)."""
    transfers = cluster.transfers
    if not transfers:
        return {"num_kv_transfers": 0}
    wire = pd.Series([t.end_s - t.start_s for t in transfers])
    wait = pd.Series([t.start_s - t.ready_s for t in transfers])
    busy = [0.0] * disaggregation.num_prefill
    for transfer in transfers:
        busy[transfer.prefill_replica] += transfer.end_s - transfer.start_s
    capacity = cluster.sim_time_s * disaggregation.link_concurrency
    return {
        "num_kv_transfers": len(transfers),
        "kv_bytes_moved": sum(t.num_blocks * disaggregation.bytes_per_block(t.prefill_replica) for t in transfers),
        "mean_kv_transfer_ms": 1000.0 * float(wire.mean()),
        "p99_kv_transfer_ms": 1000.0 * float(wire.quantile(0.99)),
        "mean_kv_link_wait_ms": 1000.0 * float(wait.mean()),
        "p99_kv_link_wait_ms": 1000.0 * float(wait.quantile(0.99)),
        "kv_link_utilization": [time / capacity if capacity else 0.0 for time in busy],
    }


def _mean_ms(values: pd.Series) -> float | None:
    return 1000.0 * float(values.mean()) if len(values) else None


def write_policy_results(folder: Path, requests: pd.DataFrame, result: RunResult, summary: dict, fmt: str) -> None:
    # The other format's tables of an earlier run into this folder go: readers take Parquet over
    # CSV, so an old steps.parquet would shadow a new steps.csv.
    other = ".csv" if fmt == "parquet" else ".parquet"
    for name in ("requests", "steps"):
        path_under(folder, name + other).unlink(missing_ok=True)
    write_table(requests, path_under(folder, "requests"), fmt)
    if result.steps.spilled:
        # Streamed during the run; complete now, so it takes its final name in one rename.
        result.steps.move_spill(path_under(folder, "steps.parquet"))
    else:
        write_table(pd.DataFrame(result.steps.as_dict()), path_under(folder, "steps"), fmt)
    write_json(path_under(folder, "summary.json"), summary)


def write_experiment_files(out_dir: Path, run: ExperimentRun) -> None:
    """The run's own files, summary.json last: a results folder is complete once it has one
    (run_experiment removes an earlier run's before it writes anything)."""
    exp = run.experiment
    resolved = exp.model_dump(mode="json")
    atomic_write_text(path_under(out_dir, "resolved.yaml"), yaml.safe_dump(resolved, sort_keys=False))
    write_json(path_under(out_dir, "run_info.json"), run.info)
    if exp.output.plots:
        from experiments.plots import plot_latency_percentiles

        plot_latency_percentiles(run, out_dir)
    write_json(path_under(out_dir, RUN_COMPLETE), [r.summary for r in run.runs])


def _run_info(exp: Experiment, kv: dict, num_requests: int) -> dict:
    model = kv["model"]
    hardware = kv["hardware"]
    return {
        # Readers (experiments.report_load) refuse a folder of another layout version.
        "format_version": FORMAT_VERSION,
        "servesim_version": __version__,
        "python": platform.python_version(),
        "seed": exp.seed,
        "num_requests": num_requests,
        "model": dataclasses.asdict(model),
        # The max_model_len a policy without one runs with.
        "model_context_length": context_length(model),
        "hardware": dataclasses.asdict(hardware),
        "kv_block_bytes": kv["block_bytes"],
        "kv_num_blocks": kv["num_blocks"],
        "kv_num_host_blocks": kv["num_host_blocks"],
        "kv_capacity_tokens": kv["num_blocks"] * exp.kv_cache.block_size,
    }
