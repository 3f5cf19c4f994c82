"""The experiment file: schema (pydantic), loading with clear errors, and `--set` overrides."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from experiments.io import NAME_RULE, name_error
from simcore.decode_blocks import MAX_BLOCK_SIZE
from simcore.errors import ConfigError
from simcore.hf_config import context_length
from simcore.model import DTYPE_BYTES, ModelSpec
from simcore.precision import ACTIVATION_DTYPE_BYTES, WEIGHT_DTYPE_BYTES, default_activation_dtype
from simcore.validate import apply_override, config_error_from_pydantic, load_yaml_mapping, set_path
from workloads.spec import WorkloadSpec


def one_of(value: str, choices: Iterable[str], what: str) -> str:
    """`value` where it names one of `choices`, else the error that lists them (a validator's)."""
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; expected one of {sorted(choices)}")
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class KVCacheConfig(Strict):
    # Positions per physical block (vLLM defaults to 16; see docs/kv-cache.md#paged-blocks).
    block_size: int = Field(16, ge=1, le=MAX_BLOCK_SIZE)
    # Stored KV scalar type: its bytes per scalar enter docs/kv-cache.md#bytes-per-token.
    dtype: str = "bf16"
    # Device blocks; when unset, derived from GPU memory x utilization minus weights. At most
    # 67,108,864 (2**26), derived or not: a run keeps state for every block (about 85 bytes each).
    num_blocks: int | None = Field(None, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    # Keep freed full blocks as evictable prefix-cache entries and reuse them across requests.
    prefix_caching: bool = False
    # Host-memory tier for swapped-out KV (GiB); 0 disables swapping. At most 67,108,864 (2**26)
    # blocks' worth (about 40 bytes of state each).
    host_memory_gib: float = Field(0.0, ge=0)

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        return one_of(value, DTYPE_BYTES, "KV dtype")


def _file_name(value: str | None) -> str | None:
    """Labels and experiment names become folder names: they follow NAME_RULE."""
    message = None if value is None else name_error(value)
    if message is not None:
        raise ValueError(message)
    return value


class _PolicyCommon(Strict):
    label: str | None = Field(None, description=(
        "Name shown in tables and plots, and the policy's results folder (DIR/<label>/); defaults to the "
        f"policy name (numbered if repeated). {NAME_RULE}; unique among the policies, ignoring case."))
    # Longest prompt + output accepted; longer requests are rejected with a reason. Unset means
    # the model's context length (max_position_embeddings, stretched by rope_scaling as vLLM
    # does); a larger value is an error.
    max_model_len: int | None = Field(None, ge=1)
    # Per-policy switch for the prefix cache; unset means kv_cache.prefix_caching.
    prefix_caching: bool | None = None

    _label_is_a_file_name = field_validator("label")(_file_name)


class _BatchingCommon(_PolicyCommon):
    """The step scheduler's options, which static batching has no use for (a group runs whole,
    with every block reserved up front, and never preempts): a static entry rejects them as
    unknown keys rather than ignore them."""

    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    admission: Literal["optimistic", "prompt", "reserve", "watermark", "conservative"] = "optimistic"
    watermark: float = Field(0.01, ge=0, lt=1)
    # Conservative admission (SGLang's): room kept for this share of the outputs still to come,
    # falling to min_new_token_ratio over new_token_ratio_decay_steps steps (docs/policies.md).
    new_token_ratio: float = Field(0.7, gt=0, le=1)
    min_new_token_ratio: float = Field(0.098, ge=0, le=1)
    new_token_ratio_decay_steps: int = Field(600, ge=1, le=10**9)
    preemption: Literal["recompute", "swap"] = "recompute"
    # The order admission takes waiting requests in (policies.queues): arrival order, request
    # priority (lower first), fewest tokens first, or longest cached prefix first (SGLang's lpm).
    queue_order: Literal["fcfs", "priority", "shortest_prompt_first", "longest_prefix_match"] = "fcfs"
    num_scheduler_steps: int = Field(1, ge=1, le=1024, description=(
        "vLLM 0.6's multi-step scheduling: after a step the scheduler planned, up to this many steps "
        "in all decode the same batch with no scheduler pass (no admission, no CPU scheduling time in "
        "the roofline), and their outputs reach clients together when the group ends. A step that "
        "only prefills whole prompts runs alone. 1: every step is scheduled (docs/policies.md)."))

    @model_validator(mode="after")
    def _ratios_only_where_read(self) -> _BatchingCommon:
        ratios = {"new_token_ratio", "min_new_token_ratio", "new_token_ratio_decay_steps"} & self.model_fields_set
        if ratios and self.admission != "conservative":
            raise ValueError(f"{', '.join(sorted(ratios))}: read only by admission: conservative, "
                             f"not by {self.admission}")
        if self.min_new_token_ratio > self.new_token_ratio:
            raise ValueError(f"min_new_token_ratio {self.min_new_token_ratio:g} is above new_token_ratio "
                             f"{self.new_token_ratio:g}: the share only falls")
        return self


class StaticPolicyConfig(_PolicyCommon):
    name: Literal["static"]
    max_batch_size: int = Field(32, ge=1)
    padded: bool = False
    # Static batching has no prefix cache: false only (needed where kv_cache.prefix_caching is true).
    prefix_caching: bool | None = None

    @field_validator("prefix_caching")
    @classmethod
    def _no_prefix_cache(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError(f"static batching has no prefix cache; expected false or unset, found {value}")
        return value


class ContinuousPolicyConfig(_BatchingCommon):
    name: Literal["continuous"]
    mixed: bool = False


class ChunkedPrefillPolicyConfig(_BatchingCommon):
    name: Literal["chunked_prefill"]
    chunk_size: int = Field(512, ge=1)
    order: Literal["stall_free", "alternate"] = "stall_free"


class OffloadPolicyConfig(_BatchingCommon):
    name: Literal["offload"]
    # The batching policy underneath: its options (chunk_size/order or mixed) apply.
    base: Literal["continuous", "chunked_prefill"] = "chunked_prefill"
    chunk_size: int = Field(512, ge=1)
    order: Literal["stall_free", "alternate"] = "stall_free"
    mixed: bool = False
    preemption: Literal["swap"] = "swap"
    # With prefix caching on, evicted cached blocks are copied to the host and reloaded on a hit.
    spill_prefix: bool = True


PolicyConfig = Annotated[
    StaticPolicyConfig | ContinuousPolicyConfig | ChunkedPrefillPolicyConfig | OffloadPolicyConfig,
    Field(discriminator="name"),
]
POLICY_NAMES = ("static", "continuous", "chunked_prefill", "offload")


class CostModelConfig(BaseModel):
    """`name` picks the model; every other key is that model's parameter (checked by its factory)."""

    model_config = ConfigDict(extra="allow")
    name: str = "roofline"

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class SLOConfig(Strict):
    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    e2el_ms: float | None = Field(None, gt=0)

    def as_dict(self) -> dict[str, float]:
        return {k.removesuffix("_ms"): v for k, v in self.model_dump().items() if v is not None}


class MetricsConfig(Strict):
    # Selection/delivery time after the step that selects an output (TTFT's third term): the
    # server's time per output (detokenizing, streaming).
    delivery_ms: float = Field(0.0, ge=0)
    frontend_ms: float = Field(0.0, ge=0, description=(
        "the server's time before its engine sees a request (HTTP, tokenization): each request reaches the "
        "engine (or the router) this long after it arrived; counted in TTFT and E2EL, as clients measure them"))
    slo: SLOConfig = Field(default_factory=SLOConfig)
    warmup_requests: int = Field(0, ge=0, description=(
        "the first this many requests sent (by arrival) are left out of the summaries: the warm-up, before "
        "the engine reaches its steady state (genai-perf's --warmup-request-count); the tables keep them"))
    cooldown_requests: int = Field(0, ge=0, description=(
        "the last this many requests sent are left out of the summaries too: the cool-down, as the load "
        "drains (with closed-loop clients, fewer are out than the clients)"))


class LimitsConfig(Strict):
    max_sim_time_s: float | None = Field(None, gt=0)
    max_wall_time_s: float | None = Field(None, gt=0)
    check_invariants: bool = False
    # Take runs of steps certain to follow a planned one at once (policies.accelerate); the
    # results are identical either way, false gives the plain loop (one step at a time).
    fast_forward: bool = True


class OutputConfig(Strict):
    format: Literal["parquet", "csv"] = "parquet"
    plots: bool = True


class RouterConfig(Strict):
    name: str = Field("round_robin", description=(
        "round_robin, random, least_outstanding, least_kv, power_of_two, session_affinity or prefix_aware "
        "(docs/cluster.md)"))
    delay_ms: float = Field(0.0, ge=0, description="time from the router's decision to the request reaching "
                            "its replica (counted in TTFT)")
    prefix_weight: float = Field(1.0, ge=0, description="prefix_aware only: weight of the share of the prompt "
                                 "a replica's prefix cache holds")
    load_weight: float = Field(1.0, ge=0, description="prefix_aware only: weight of the queue score (1 for the "
                               "replica with the fewest requests in flight, 0 for the most)")

    @field_validator("name")
    @classmethod
    def _known_router(cls, value: str) -> str:
        from policies.routers import ROUTERS

        return one_of(value, ROUTERS, "router")

    @model_validator(mode="after")
    def _weights_only_where_read(self) -> RouterConfig:
        from policies.routers import ROUTER_PARAMS

        for name in ("prefix_weight", "load_weight"):
            if name in self.model_fields_set and name not in ROUTER_PARAMS.get(self.name, ()):
                raise ValueError(f"{name} is read only by the prefix_aware router, not by {self.name}")
        return self

    def params(self) -> dict[str, float]:
        """The router's own parameters (policies.routers.ROUTER_PARAMS)."""
        from policies.routers import ROUTER_PARAMS

        return {name: getattr(self, name) for name in ROUTER_PARAMS.get(self.name, ())}


class KVLinkConfig(Strict):
    preset: str = Field("infiniband-ndr", description=(
        "the link a prefill replica sends KV over: nvlink-4, infiniband-ndr, roce-400g, pcie-gen5, ... "
        "(servesim hardware lists them)"))
    bandwidth_gb_s: float | None = Field(None, gt=0, description="one-way bandwidth in GB/s (1e9 bytes a "
                                         "second), instead of the preset's")
    latency_us: float | None = Field(None, ge=0, description="fixed cost of one transfer, instead of the preset's")
    concurrency: int = Field(1, ge=1, le=1024, description="transfers a prefill replica's link carries at once; "
                             "more wait their turn")

    @field_validator("preset")
    @classmethod
    def _known_link(cls, value: str) -> str:
        from simcore.presets import LINKS

        return one_of(value, LINKS, "link")

    def spec(self):  # noqa: ANN201 - simcore.presets.LinkSpec
        from simcore.presets import GB, LINKS, LinkSpec

        preset = LINKS[self.preset]
        return LinkSpec(self.preset, preset.bytes_per_s if self.bandwidth_gb_s is None else self.bandwidth_gb_s * GB,
                        preset.latency_s if self.latency_us is None else self.latency_us * 1e-6)


class ReplicaKVConfig(Strict):
    num_blocks: int | None = Field(None, ge=1, description="device KV blocks (default: kv_cache.num_blocks, or "
                                   "derived from this replica's memory)")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    host_memory_gib: float | None = Field(None, ge=0)


class ReplicaSettings(Strict):
    """What a kind of replica changes from the experiment's own settings (unset: the experiment's)."""

    hardware: str | dict[str, Any] | None = Field(None, description="a preset name or a hardware mapping")
    tensor_parallel: int | None = Field(None, ge=1)
    pipeline_parallel: int | None = Field(None, ge=1)
    kv_cache: ReplicaKVConfig | None = Field(None, description="its KV cache's size (the block size and dtype "
                                             "are the cluster's: blocks move between replicas unchanged)")
    cost_model: CostModelConfig | None = Field(None, description="its cost model, in place of the experiment's")

    def applied_to(self, exp: Experiment) -> Experiment:
        """`exp` with these changes (each value was checked as the experiment's own would be)."""
        changes: dict[str, Any] = {name: getattr(self, name) for name in ("hardware", "tensor_parallel",
                                   "pipeline_parallel", "cost_model") if getattr(self, name) is not None}
        if self.kv_cache is not None:
            changes["kv_cache"] = exp.kv_cache.model_copy(update=self.kv_cache.model_dump(exclude_none=True))
        return exp.model_copy(update=changes)


class ReplicaGroup(ReplicaSettings):
    replicas: int = Field(ge=1, le=256, description="replicas of this kind")


class ClusterConfig(Strict):
    replicas: int | None = Field(None, ge=1, le=256, description=(
        "identical replicas of the engine behind `router`, each its own policy, KV cache and cost model "
        "(default 1)"))
    groups: list[ReplicaGroup] | None = Field(None, min_length=1, description=(
        "replicas that differ (hardware, parallelism, KV cache, cost model), a group of each kind, in "
        "place of `replicas`: [{replicas: 2, hardware: h200}, {replicas: 2, hardware: a100-80gb}]"))
    prefill: ReplicaSettings | None = Field(None, description="disaggregated: what the prefill replicas change "
                                            "from the experiment's settings (e.g. their hardware)")
    decode: ReplicaSettings | None = Field(None, description="disaggregated: what the decode replicas change")
    router: RouterConfig = Field(default_factory=RouterConfig, description="picks the replica (the prefill "
                                 "replica, when disaggregated) each request goes to")
    prefill_replicas: int | None = Field(None, ge=1, le=256, description="disaggregated: replicas that prefill "
                                         "each request to its first output")
    decode_replicas: int | None = Field(None, ge=1, le=256, description="disaggregated: replicas that continue "
                                        "each request once its KV has arrived")
    decode_router: RouterConfig | None = Field(None, description="disaggregated: picks the decode replica "
                                               "(default: the same as `router`)")
    link: KVLinkConfig | None = Field(None, description="disaggregated: the link each prefill replica sends KV "
                                      "over (default infiniband-ndr)")

    @model_validator(mode="after")
    def _one_shape(self) -> ClusterConfig:
        split = (self.prefill_replicas, self.decode_replicas)
        if self.replicas is not None and split != (None, None):
            raise ValueError("give replicas, or prefill_replicas and decode_replicas (disaggregated), not both")
        if (split[0] is None) != (split[1] is None):
            raise ValueError("a disaggregated cluster needs both prefill_replicas and decode_replicas (at least 1 each)")
        if self.disaggregated and self.prefill_replicas + self.decode_replicas > 256:  # type: ignore[operator]
            raise ValueError("at most 256 replicas in all")
        split_only = [name for name in ("decode_router", "link", "prefill", "decode") if getattr(self, name) is not None]
        if not self.disaggregated and split_only:
            raise ValueError(f"{', '.join(split_only)}: read only by a disaggregated cluster (prefill_replicas "
                             "and decode_replicas); replicas that differ otherwise are `groups`")
        if self.groups is not None:
            if self.replicas is not None or self.disaggregated:
                raise ValueError("give groups (replicas of each kind) in place of replicas, and not in a "
                                 "disaggregated cluster (there: prefill and decode settings)")
            if sum(group.replicas for group in self.groups) > 256:
                raise ValueError("at most 256 replicas in all")
        return self

    def replica_settings(self) -> list[ReplicaSettings | None]:
        """Each replica's changes from the experiment's settings (None: none), in replica order
        (a disaggregated cluster's prefill replicas first)."""
        if self.groups is not None:
            return [group for group in self.groups for _ in range(group.replicas)]
        if self.disaggregated:
            return [self.prefill] * self.prefill_replicas + [self.decode] * self.decode_replicas  # type: ignore[operator]
        return [None] * self.num_replicas

    @property
    def disaggregated(self) -> bool:
        return self.prefill_replicas is not None

    @property
    def num_replicas(self) -> int:
        if self.disaggregated:
            return self.prefill_replicas + self.decode_replicas  # type: ignore[operator]
        if self.groups is not None:
            return sum(group.replicas for group in self.groups)
        return self.replicas if self.replicas is not None else 1


class ClientsConfig(Strict):
    concurrency: int | None = Field(None, ge=1, le=1_000_000, description=(
        "closed loop: this many clients send the workload's requests in order, each its next one when its "
        "last came back (vllm bench serve --max-concurrency); the workload's arrival times are not read. "
        "Unset: open loop, at the workload's arrival times"))
    think_time_s: float = Field(0.0, ge=0, description="closed loop: time between a request coming back and "
                                "its client's next one (the mean, when exponential)")
    think_time: Literal["fixed", "exponential"] = "fixed"
    timeout_s: float | None = Field(None, gt=0, description=(
        "a client gives up on a request not finished this long after it sent it: the request leaves the "
        "engine, its KV blocks freed, and counts as timed_out (a closed-loop client then sends its next)"))

    @model_validator(mode="after")
    def _think_time_needs_a_closed_loop(self) -> ClientsConfig:
        if self.concurrency is None and {"think_time_s", "think_time"} & self.model_fields_set:
            raise ValueError("think_time_s and think_time are read only by closed-loop clients (concurrency)")
        if self.concurrency is None and self.timeout_s is None:
            raise ValueError("clients: give concurrency (closed loop), timeout_s, or both")
        return self


class Experiment(Strict):
    name: str = Field("experiment", description=(
        "Shown in titles; names the default results folder (results/<name>, results/<name>-sweep). "
        f"{NAME_RULE}."))
    description: str = ""
    seed: int = Field(0, ge=0)
    # Model preset name, or a path to a Hugging Face config.json (relative to this file).
    model: str = "llama-3.1-8b"
    hardware: str | dict[str, Any] = "h100-sxm"
    tensor_parallel: int = Field(1, ge=1)
    pipeline_parallel: int = Field(1, ge=1, description=(
        "Pipeline stages the layers are split over (a divisor of the model's layers): weights and KV per GPU "
        "divide by it; a step runs through every stage in turn, one batch in flight (docs/cost-models.md)"))
    attention_data_parallel: bool = Field(False, description=(
        "Attention data parallel over the tensor_parallel GPUs with the routed experts spread over them "
        "(expert parallelism: SGLang's --enable-dp-attention, TensorRT-LLM's attention DP with MoE EP, 'DEP'): "
        "each GPU runs its share of the batch through attention and the non-expert layers with all their "
        "weights and every KV head, and each MoE layer sends tokens to their experts' GPUs and back "
        "(all-to-all); KV capacity is every GPU's own blocks (docs/cost-models.md)"))
    weight_dtype: str = Field("bf16", description=(
        "Weight scalar type: bytes per parameter for memory and roofline traffic (fp4 and int4: 0.5; "
        "nvfp4 and mxfp4 with their block scales: 4.5 and 4.25 bits)"))
    expert_weight_dtype: str | None = Field(None, description=(
        "Weight scalar type of a mixture-of-experts model's routed experts where the checkpoint quantizes "
        "them apart (mxfp4: 4.25 bits, OCP MX); unset: the model's own (gpt-oss: mxfp4), else weight_dtype"))
    activation_dtype: str | None = Field(None, description=(
        "The GEMMs' compute dtype, whose tensor-core peak prices dense FLOPs; unset: fp8 and int8 weights "
        "run W8A8 (activations of their type); on a part with an fp4 peak fp4 and nvfp4 weights run W4A4, "
        "mxfp4 W4A8; other 4-bit weights weight-only (bf16); others their own type"))
    kv_cache: KVCacheConfig = Field(default_factory=KVCacheConfig)
    workload: WorkloadSpec
    cost_model: CostModelConfig = Field(default_factory=CostModelConfig)
    policies: list[PolicyConfig] = Field(min_length=1)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    cluster: ClusterConfig | None = Field(None, description="several replicas behind a router, or prefill and "
                                          "decode replicas (docs/cluster.md); none: one engine")
    clients: ClientsConfig | None = Field(None, description="closed-loop clients instead of the workload's "
                                          "arrival times, and clients that give up (timeout_s)")
    output: OutputConfig = Field(default_factory=OutputConfig)
    # Sweeps (servesim sweep): dotted path -> list of values, plus optional `mode: product|zip`;
    # checked by experiments.sweep, which expands them into points.
    sweep: dict[str, Any] | None = None
    # Named whole-experiment variants: name -> {dotted path: value}, compared on the same workload.
    variants: dict[str, dict[str, Any]] | None = None

    @field_validator("weight_dtype")
    @classmethod
    def _known_weight_dtype(cls, value: str) -> str:
        return one_of(value, WEIGHT_DTYPE_BYTES, "weight dtype")

    @field_validator("expert_weight_dtype")
    @classmethod
    def _known_expert_weight_dtype(cls, value: str | None) -> str | None:
        return value if value is None else one_of(value, WEIGHT_DTYPE_BYTES, "weight dtype")

    @field_validator("activation_dtype")
    @classmethod
    def _known_activation_dtype(cls, value: str | None) -> str | None:
        return value if value is None else one_of(value, ACTIVATION_DTYPE_BYTES, "activation dtype")

    def compute_dtype_on(self, hardware: Any) -> str:
        """activation_dtype, or the one engines pair with weight_dtype on this hardware (4-bit
        floating-point weights run W4A4 or W4A8 where it has an fp4 peak)."""
        return self.activation_dtype or default_activation_dtype(self.weight_dtype,
                                                                 fp4_peak=hardware.peak("fp4") is not None)

    _name_is_a_file_name = field_validator("name")(_file_name)

    @model_validator(mode="after")
    def _unique_labels(self) -> Experiment:
        labels = policy_labels(self.policies)
        # Ignoring case: each label is a folder, and `A` and `a` are one folder on macOS and Windows.
        if len({label.lower() for label in labels}) != len(labels):
            raise ValueError(f"policy labels must be unique (ignoring case), got {labels}")
        return self

    @model_validator(mode="after")
    def _disaggregation_needs_a_continuing_policy(self) -> Experiment:
        if self.cluster is not None and self.cluster.disaggregated:
            if self.clients is not None and self.clients.timeout_s is not None:
                raise ValueError("clients.timeout_s: client timeouts are not modelled in a disaggregated cluster "
                                 "(prefill_replicas and decode_replicas)")
            for index, policy in enumerate(self.policies):
                if policy.name == "static":
                    raise ValueError(f"policies[{index}]: static batching cannot continue a request prefilled "
                                     "elsewhere; a disaggregated cluster runs continuous, chunked_prefill or offload")
        return self

    @model_validator(mode="after")
    def _attention_data_parallel_over_gpus(self) -> Experiment:
        if self.attention_data_parallel:
            if self.tensor_parallel < 2:
                raise ValueError("attention_data_parallel: spreads attention over the tensor_parallel GPUs; "
                                 f"expected tensor_parallel of 2 or more, found {self.tensor_parallel}")
            if self.pipeline_parallel > 1:
                raise ValueError("attention_data_parallel: not modelled with pipeline stages; expected "
                                 f"pipeline_parallel 1, found {self.pipeline_parallel}")
        return self

    @model_validator(mode="after")
    def _timeouts_not_under_multi_step(self) -> Experiment:
        if self.clients is not None and self.clients.timeout_s is not None:
            for index, policy in enumerate(self.policies):
                if getattr(policy, "num_scheduler_steps", 1) > 1:
                    raise ValueError(f"policies[{index}].num_scheduler_steps: client timeouts (clients.timeout_s) "
                                     "are not modelled under multi-step scheduling; expected 1, found "
                                     f"{policy.num_scheduler_steps}")
        return self

    @model_validator(mode="after")
    def _static_runs_without_a_prefix_cache(self) -> Experiment:
        """A static entry under kv_cache.prefix_caching: true would run without the cache asked
        for: said, not done silently (setting its own prefix_caching: false says it is meant)."""
        if self.kv_cache.prefix_caching:
            for index, policy in enumerate(self.policies):
                if policy.name == "static" and policy.prefix_caching is None:
                    raise ValueError(
                        f"policies[{index}].prefix_caching: static batching has no prefix cache, and "
                        "kv_cache.prefix_caching is true; set prefix_caching: false on this policy to run "
                        "it without one")
        return self


def policy_labels(policies: list) -> list[str]:
    """Each policy's label; unlabelled repeats of a name are numbered (continuous, continuous-2)."""
    labels: list[str] = []
    for policy in policies:
        label = policy.label or policy.name
        if policy.label is None and label in labels:
            n = 2
            while f"{label}-{n}" in labels:
                n += 1
            label = f"{label}-{n}"
        labels.append(label)
    return labels


def resolve_max_model_len(requested: int | None, model: ModelSpec, *, where: str, source: str | None) -> int:
    """The max_model_len a policy runs with: `requested`, or the model's context length when unset.

    A value past the model's context is an error, as in vLLM (which allows it only with
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1): positions past it are ones the model was never trained on.
    """
    limit = context_length(model)
    if requested is None:
        return limit
    if requested > limit:
        origin = f"max_position_embeddings {model.max_position_embeddings}"
        if limit != model.max_position_embeddings:
            origin += " stretched by its rope_scaling"
        raise ConfigError(
            f"longer than the context of model {model.name!r} ({limit} tokens: {origin}); leave it unset for "
            "the model's context, or use a config.json with a larger max_position_embeddings to simulate a "
            "longer one",
            source=source, where=where, expected=f"at most {limit}", found=requested,
        )
    return requested


def load_yaml(path: Path) -> dict[str, Any]:
    """An experiment file's mapping: YAML errors with line and column, duplicate keys rejected."""
    return load_yaml_mapping(path, what="experiment file")


def apply_overrides(data: dict[str, Any], overrides: list[str], *, source: str | None = None) -> dict[str, Any]:
    """`key.path=value` overrides (value parsed as YAML); list items by index, e.g. policies.0.chunk_size=64."""
    for item in overrides:
        apply_override(data, item, source=source)
    return data


def set_dotted(data: dict[str, Any], path: str, value: Any, *, source: str | None = None) -> None:
    set_path(data, path, value, source=source)


def parse_experiment(data: dict[str, Any], *, source: str | None) -> Experiment:
    try:
        return Experiment.model_validate(data)
    except ValidationError as exc:
        raise config_error_from_pydantic(exc, source=source, model=Experiment) from None


def load_raw(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """An experiment file's mapping with `--set` overrides applied, not yet validated."""
    data = load_yaml(Path(path))
    if overrides:
        apply_overrides(data, overrides, source=str(path))
    return data


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> Experiment:
    return parse_experiment(load_raw(path, overrides), source=str(path))
