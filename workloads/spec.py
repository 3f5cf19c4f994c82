"""The `workload:` section of an experiment file, as pydantic models, and `build_requests`.

A workload is either synthetic (arrival process + length distributions, optionally with shared
prefixes or multi-turn sessions) or a trace file (with options to window, sample and rescale it):

    workload:
      num_requests: 300                      # synthetic count; for traces and sessions a cap
      arrivals: {kind: poisson, rate: 4.0}
      prompt_len: {kind: lognormal, median: 512, sigma: 0.8, min: 1, max: 8192}
      output_len: {kind: fixed, value: 128}
      max_tokens: null
      prefix: {num_prefixes: 8, prefix_len: {kind: fixed, value: 1024}, choice: {kind: zipf, s: 1.1}}
      sessions: {num_sessions: 50, turns: {kind: uniform, low: 1, high: 6},
                 think_time_s: {kind: lognormal, median: 20, sigma: 0.5}}
      priority: {kind: choice, values: [0, 1, 2], weights: [0.2, 0.3, 0.5]}   # lower is served first
      # or instead of arrivals/prompt_len/output_len/prefix/sessions:
      trace: {path: builtin:azure_conv_2023, time_window: [0, 600]}

Every model forbids unknown keys, so a typo is an error naming the key, never silently ignored.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator
from pydantic_core import PydanticCustomError

from simcore.errors import close_match

if TYPE_CHECKING:
    from simcore.request import Request
    from workloads.build import Workload


# Largest token count a length may have (prompt, output, cap): beyond int32 nothing real runs,
# and it keeps every sum of lengths inside int64.
MAX_TOKENS = 2**31 - 1
# Largest number of requests, sessions (and turns of all sessions together), prefixes or sampled
# trace rows a workload may ask for: what a run can hold on the documented 2-core, 24 GiB machine.
# A run keeps about 1.7 KB per request (1M requests peak at 1.6-1.8 GiB, benchmarks/README.md)
# and about 0.35 KB per request for each further policy (each keeps its requests table), so 5M
# requests take some 8.5 GB with one policy and 14 GB with four, leaving room for the largest KV
# cache servesim tracks (experiments.runner.MAX_BLOCKS: some 8.4 GB of device and host block state).
MAX_COUNT = 5_000_000
# Request priorities: any int32, negatives included (vLLM's default is 0, lower first); ample for any
# labelling scheme, and every value fits an int32 column of a results or trace file.
MIN_PRIORITY = -(2**31)
MAX_PRIORITY = 2**31 - 1


class StrictModel(BaseModel):
    # Unknown keys are errors; inf and NaN are never meaningful numbers here (except time_window's end).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _check_order(low: float, high: float | None, low_name: str, high_name: str) -> None:
    if high is not None and low > high:
        raise PydanticCustomError("order", f"{low_name} ({low}) must be <= {high_name} ({high})")


# --- arrival processes -------------------------------------------------------------------------


class PoissonArrivals(StrictModel):
    """Exponential gaps with mean 1/rate (a Poisson process, no capping)."""

    kind: Literal["poisson"]
    rate: float = Field(gt=0, description="requests per second")


class GammaArrivals(StrictModel):
    """Gamma-distributed gaps: mean 1/rate, coefficient of variation cv (cv=1 is Poisson, >1 bursty)."""

    kind: Literal["gamma"]
    rate: float = Field(gt=0)
    # Bounded so that the gamma shape 1/cv^2 stays a finite, positive number (the fuzzer found
    # cv = 1e-229 and 1e154, which overflowed it).
    cv: float = Field(ge=0.001, le=100, description="coefficient of variation of the gaps, 0.001 to 100")


class ConstantArrivals(StrictModel):
    """Evenly spaced arrivals, 1/rate apart."""

    kind: Literal["constant"]
    rate: float = Field(gt=0)


class BurstArrivals(StrictModel):
    """Every request arrives at the same instant (offline / batch inference)."""

    kind: Literal["burst"]
    at: float = Field(default=0.0, ge=0)


ArrivalSpec = Annotated[
    PoissonArrivals | GammaArrivals | ConstantArrivals | BurstArrivals, Field(discriminator="kind")
]


# --- token-length distributions (integers >= 1) -----------------------------------------------


class FixedLength(StrictModel):
    kind: Literal["fixed"]
    value: int = Field(ge=1, le=MAX_TOKENS)


class UniformLength(StrictModel):
    """Integers drawn uniformly from [low, high], both ends included."""

    kind: Literal["uniform"]
    low: int = Field(ge=1, le=MAX_TOKENS)
    high: int = Field(ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        _check_order(self.low, self.high, "low", "high")
        return self


class LognormalLength(StrictModel):
    """median * exp(sigma * N(0,1)), rounded, then clipped to [min, max]."""

    kind: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)
    min: int = Field(default=1, ge=1, le=MAX_TOKENS)
    max: int | None = Field(default=None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> LognormalLength:
        _check_order(self.min, self.max, "min", "max")
        return self


class NormalLength(StrictModel):
    """N(mean, std), rounded, then clipped to [min, max]."""

    kind: Literal["normal"]
    mean: float
    std: float = Field(ge=0)
    min: int = Field(default=1, ge=1, le=MAX_TOKENS)
    max: int | None = Field(default=None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> NormalLength:
        _check_order(self.min, self.max, "min", "max")
        return self


class EmpiricalLength(StrictModel):
    """Each draw picks one of `values` uniformly (repeat a value to weight it)."""

    kind: Literal["empirical"]
    values: list[Annotated[int, Field(ge=1, le=MAX_TOKENS)]] = Field(min_length=1)


LengthDist = Annotated[
    FixedLength | UniformLength | LognormalLength | NormalLength | EmpiricalLength,
    Field(discriminator="kind"),
]


# --- durations in seconds (floats >= 0), for think times ---------------------------------------


class FixedDuration(StrictModel):
    kind: Literal["fixed"]
    value: float = Field(ge=0)


class UniformDuration(StrictModel):
    kind: Literal["uniform"]
    low: float = Field(ge=0)
    high: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> UniformDuration:
        _check_order(self.low, self.high, "low", "high")
        return self


class LognormalDuration(StrictModel):
    kind: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)
    max: float | None = Field(default=None, gt=0)


class ExponentialDuration(StrictModel):
    kind: Literal["exponential"]
    mean: float = Field(gt=0)


DurationDist = Annotated[
    FixedDuration | UniformDuration | LognormalDuration | ExponentialDuration, Field(discriminator="kind")
]


# --- request priorities (integers, negatives allowed) ------------------------------------------
# The length kinds above cannot be reused: they require values >= 1, and priorities are usually
# small labels around 0 (vLLM's default) where a clipped lognormal means nothing.

PriorityValue = Annotated[int, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY)]


class FixedPriority(StrictModel):
    """Every request gets `value`."""

    kind: Literal["fixed"]
    value: PriorityValue


class UniformPriority(StrictModel):
    """Integers drawn uniformly from [low, high], both ends included."""

    kind: Literal["uniform"]
    low: PriorityValue
    high: PriorityValue

    @model_validator(mode="after")
    def _ordered(self) -> UniformPriority:
        _check_order(self.low, self.high, "low", "high")
        return self


class ChoicePriority(StrictModel):
    """Each draw is one of `values`, with probability proportional to `weights` (equal when left out)."""

    kind: Literal["choice"]
    values: list[PriorityValue] = Field(min_length=1)
    # One positive, finite weight per value; they need not sum to 1.
    weights: list[Annotated[float, Field(gt=0)]] | None = None

    @model_validator(mode="after")
    def _matching_weights(self) -> ChoicePriority:
        if self.weights is not None and len(self.weights) != len(self.values):
            raise PydanticCustomError(
                "length", "weights has {found} entries but values has {expected}: give one weight per value",
                {"found": len(self.weights), "expected": len(self.values)},
            )
        return self


PriorityDist = Annotated[FixedPriority | UniformPriority | ChoicePriority, Field(discriminator="kind")]


# --- shared prefixes and sessions --------------------------------------------------------------


class UniformChoice(StrictModel):
    kind: Literal["uniform"]


class ZipfChoice(StrictModel):
    """Prefix k (0-based) is picked with probability proportional to 1 / (k + 1)^s."""

    kind: Literal["zipf"]
    s: float = Field(default=1.1, gt=0)


class PrefixSpec(StrictModel):
    """A pool of shared prefixes (system prompts, documents) that requests start with.

    A prefixed request's prompt is prefix + its own suffix, and its `prompt_len` counts both:
    the workload's `prompt_len` distribution then describes the suffix only.
    """

    # Size of the prefix pool.
    num_prefixes: int = Field(ge=1, le=MAX_COUNT)
    prefix_len: LengthDist
    choice: Annotated[UniformChoice | ZipfChoice, Field(discriminator="kind")] = UniformChoice(kind="uniform")
    share: float = Field(default=1.0, ge=0, le=1, description="fraction of requests (or sessions) with a prefix")


class SessionSpec(StrictModel):
    """Multi-turn conversations: turn k+1's prompt = turn k's prompt + its output + a new message.

    The first message of a session is drawn from the workload's `prompt_len`, later ones from
    `message_len` (defaults to `prompt_len`); outputs from `output_len`.
    """

    # Sessions drawn; their turns together may be at most 5,000,000 requests too.
    num_sessions: int = Field(ge=1, le=MAX_COUNT)
    turns: LengthDist
    think_time_s: DurationDist
    message_len: LengthDist | None = None


# --- traces ------------------------------------------------------------------------------------

BUILTIN_FORMATS = {"builtin:azure_conv_2023": "azure"}
GENERIC_COLUMNS = (
    "arrival_s", "prompt_len", "output_len", "prompt_token_ids", "segments", "prefix_key", "prefix_len",
    "session_id", "turn", "cache_salt", "adapter_id", "priority",
)


class TraceSample(StrictModel):
    """A random subset of n rows (conversations for sharegpt), kept in arrival order."""

    # Rows kept.
    n: int = Field(ge=1, le=MAX_COUNT)
    seed: int | None = Field(default=None, ge=0, description="defaults to a stream of the experiment seed")
    replace: bool = Field(default=False, description="draw with replacement (resampling), so n may exceed the rows")


class TraceBase(StrictModel):
    path: str = Field(description="relative to the experiment file's folder, or builtin:<name>")
    max_requests: int | None = Field(default=None, ge=1)
    sample: TraceSample | None = None


class TimedTrace(TraceBase):
    keep_absolute: bool = Field(
        default=False, description="keep the file's own clock instead of 0 = first row (the simulation starts at 0 s: an earlier arrival is an error)"
    )
    shift_to_zero: bool = Field(default=False, description="after windowing/sampling, start the first request at 0")
    time_window: tuple[float, Annotated[float, Field(allow_inf_nan=True)]] | None = Field(default=None, description="[start_s, end_s): keep rows inside")
    time_scale: float | None = Field(default=None, gt=0, description="multiply every gap")
    target_rate: float | None = Field(default=None, gt=0, description="rescale gaps to this mean rate (req/s)")
    lengths_only: bool = Field(default=False, description="keep lengths, draw arrivals from `arrivals`")

    @model_validator(mode="after")
    def _timing(self) -> TimedTrace:
        if self.time_scale is not None and self.target_rate is not None:
            raise PydanticCustomError("conflict", "time_scale and target_rate both rescale time; set only one")
        if self.time_window is not None:
            _check_order(self.time_window[0], self.time_window[1], "time_window start", "end")
        return self

    @field_validator("time_window")
    @classmethod
    def _window_end_is_a_time(cls, window: tuple[float, float] | None) -> tuple[float, float] | None:
        # The end may be .inf (no end) but not NaN, which every arrival time compares false against.
        if window is not None and math.isnan(window[1]):
            raise PydanticCustomError("nan", "time_window end must be a time in seconds or .inf (no end), found nan")
        return window


class GenericTrace(TimedTrace):
    """Our own columns (arrival_s, prompt_len, output_len, ...), renamed with `columns`.

    Optional columns: prompt_token_ids or segments (prompt content), prefix_key + prefix_len,
    session_id, turn, cache_salt, adapter_id, and priority (a whole number in int32 range,
    negatives allowed, lower served first; every row needs one when the column is there).
    """

    format: Literal["csv", "jsonl", "parquet"]
    columns: dict[str, str] = Field(default_factory=dict, description="our column name -> the file's")
    time_unit: Literal["s", "ms", "us"] = "s"

    @field_validator("columns")
    @classmethod
    def _known_columns(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if key not in GENERIC_COLUMNS:
                hint = close_match(key, GENERIC_COLUMNS)
                hint_text = f" (did you mean {hint!r}?)" if hint else ""
                raise PydanticCustomError(
                    "unknown_column", f"unknown column name {key!r}{hint_text}; expected one of {list(GENERIC_COLUMNS)}"
                )
        return value


class AzureTrace(TimedTrace):
    """Azure LLM inference trace 2023/2024 (TIMESTAMP,ContextTokens,GeneratedTokens) or Vidur's layout."""

    format: Literal["azure"] = "azure"


class BurstGptTrace(TimedTrace):
    """BurstGPT (Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type)."""

    format: Literal["burstgpt"]
    model: str | list[str] | None = None
    log_type: str | list[str] | None = None


class MooncakeTrace(TimedTrace):
    """Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (one per block)."""

    format: Literal["mooncake"]
    block_size: int = Field(default=512, ge=1, le=MAX_TOKENS)


class ShareGptTrace(TraceBase):
    """ShareGPT conversations, each replayed as a session; arrivals come from `arrivals`."""

    format: Literal["sharegpt"]
    tokenizer: str | None = Field(default=None, description="local tokenizer folder (needs transformers)")
    chars_per_token: float = Field(default=4.0, gt=0, description="estimate used without a tokenizer")
    think_time_s: DurationDist = FixedDuration(kind="fixed", value=0.0)


def _trace_format(data: Any) -> str | None:
    # Builtin traces know their format, so `format:` may be left out for them.
    if isinstance(data, dict):
        fmt = data.get("format")
        if fmt is None:
            fmt = BUILTIN_FORMATS.get(str(data.get("path", "")))
        return fmt if fmt in TRACE_FORMATS else None
    return getattr(data, "format", None)


TRACE_FORMATS = ("csv", "jsonl", "parquet", "azure", "burstgpt", "mooncake", "sharegpt")

TraceSpec = Annotated[
    (
        Annotated[GenericTrace, Tag("csv")]
        | Annotated[GenericTrace, Tag("jsonl")]
        | Annotated[GenericTrace, Tag("parquet")]
        | Annotated[AzureTrace, Tag("azure")]
        | Annotated[BurstGptTrace, Tag("burstgpt")]
        | Annotated[MooncakeTrace, Tag("mooncake")]
        | Annotated[ShareGptTrace, Tag("sharegpt")]
    ),
    Discriminator(
        _trace_format,
        custom_error_type="trace_format",
        custom_error_message=f"missing or unknown trace format; expected format: one of {list(TRACE_FORMATS)}",
    ),
]


# --- the whole section -------------------------------------------------------------------------


class WorkloadSpec(StrictModel):
    # Requests drawn (synthetic); for traces and sessions an upper bound. At most 5,000,000: a run
    # holds about 1.7 KB per request, and 0.35 KB more per request for each further policy.
    num_requests: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    arrivals: ArrivalSpec | None = None
    prompt_len: LengthDist | None = None
    output_len: LengthDist | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS, description="cap on every request's outputs")
    prefix: PrefixSpec | None = None
    sessions: SessionSpec | None = None
    trace: TraceSpec | None = None
    # Each request's scheduling priority (lower is served first under a policy's `queue_order:
    # priority`); every request gets 0 when left out. One draw per session, shared by its turns;
    # with a trace, one per row (per session for rows with a session_id, and per conversation for
    # sharegpt). A trace with its own `priority` column and this key at once is an error.
    priority: PriorityDist | None = None

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadSpec:
        if self.trace is not None:
            _check_trace_combination(self)
            return self
        missing = [name for name in ("arrivals", "prompt_len", "output_len") if getattr(self, name) is None]
        if self.sessions is None and self.num_requests is None:
            missing.insert(0, "num_requests")
        if missing:
            raise PydanticCustomError(
                "incomplete", "a synthetic workload needs {missing} (or give a trace instead)", {"missing": missing}
            )
        return self


def _check_trace_combination(spec: WorkloadSpec) -> None:
    clashing = [name for name in ("prompt_len", "output_len", "prefix", "sessions") if getattr(spec, name) is not None]
    if clashing:
        raise PydanticCustomError(
            "conflict",
            "trace and {clashing} are mutually exclusive: a trace brings its own lengths",
            {"clashing": clashing},
        )
    trace = spec.trace
    needs_arrivals = isinstance(trace, ShareGptTrace) or getattr(trace, "lengths_only", False)
    if needs_arrivals and spec.arrivals is None:
        raise PydanticCustomError(
            "incomplete", "this trace takes new arrival times from `arrivals` (sharegpt or lengths_only: true); add it"
        )
    if not needs_arrivals and spec.arrivals is not None:
        raise PydanticCustomError(
            "conflict",
            "`arrivals` would be ignored: the trace has its own times (set trace.lengths_only: true to use it)",
        )


def parse_workload(data: Any, *, source: str | Path | None = None) -> WorkloadSpec:
    """The `workload:` mapping of an experiment file as a WorkloadSpec, or a ConfigError naming the key."""
    from simcore.validate import config_error_from_pydantic

    try:
        return WorkloadSpec.model_validate(data)
    except pydantic.ValidationError as exc:
        raise config_error_from_pydantic(exc, source=source, prefix="workload", model=WorkloadSpec) from None


def build_workload(spec: WorkloadSpec, *, seed: int, base_dir: Path, source: str | None = None) -> Workload:
    """The requests of `spec` plus notes for the user (e.g. rows a trace reader dropped)."""
    from workloads.build import build

    return build(spec, seed=seed, base_dir=Path(base_dir), source=source)


def build_requests(spec: WorkloadSpec, *, seed: int, base_dir: Path, source: str | None = None) -> list[Request]:
    """Requests sorted by arrival, request_id 0..n-1 in that order; same spec + seed -> same list."""
    return build_workload(spec, seed=seed, base_dir=base_dir, source=source).requests
