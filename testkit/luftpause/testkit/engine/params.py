"""Parameters of the simulated engine and of its HTTP face, and the named profiles.

Pure module: values only. The timing defaults come from `bench/calibrate_engine.py`
(llama.cpp, Gemma 3 270M Q4_K_M, one CPU thread); see the test kit README for the table. The
profiles (`--profile`) are starting points the flags then adjust: `cpu` is those defaults,
`gpu` a small GPU engine batching as SGLang does (the step costs of bench/arms.py GPU_PROFILE).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from luftpause.testkit.engine.kvcache import EVICTIONS, Eviction
from luftpause.testkit.engine.ratelimit import REGIMES, Regime
from luftpause.testkit.engine.ratelimit_headers import HEADER_FAMILIES, HeaderFamily
from luftpause.testkit.engine.tokens import GRANULARITIES, Granularity

# Measured by bench/calibrate_engine.py; the README's calibration table says how.
CALIBRATED_PREFILL_MS_PER_TOKEN = 4.98
CALIBRATED_DECODE_BASE_MS = 39.9
CALIBRATED_DECODE_MS_PER_SEQ = 10.1

Kind = Literal["generative", "single-pass"]
# How the waiting queue is ordered: arrival only, or by the request's `priority` field (lower
# values first, as vLLM's priority policy; or higher first, as SGLang's default), then arrival.
PriorityOrder = Literal["off", "low-first", "high-first"]
# How the model calls tools: OpenAI `tool_calls`, or a `<tool_call>` block in plain text.
ToolStyle = Literal["openai", "text"]
TOOL_STYLES: tuple[ToolStyle, ...] = ("openai", "text")
# How a waiting request is admitted: with blocks for its whole reply reserved up front; as
# SGLang does (ratio-discounted reply estimates, reply blocks on demand, retraction; `sglang`);
# or when its prompt and a reply reserve fit what is free now, the running requests' replies
# growing on demand and the latest admitted giving way when they run out (`ondemand`, vLLM).
Admission = Literal["reserve", "sglang", "ondemand"]
ADMISSIONS: tuple[Admission, ...] = ("reserve", "sglang", "ondemand")
# How a prompt's uncached tokens are computed: all in the iteration that admits it, with the
# batch's decode step (`off`); in chunks of `chunk_tokens` beside the decode step (`mixed`,
# vLLM); or in chunks in iterations of their own that the batch waits through (`separate`,
# SGLang without --enable-mixed-chunk).
ChunkedPrefill = Literal["off", "mixed", "separate"]
CHUNKED_PREFILLS: tuple[ChunkedPrefill, ...] = ("off", "mixed", "separate")
# Which metric names /metrics carries: both engines' (the default), SGLang's, vLLM's, only
# llama.cpp's request counts (no KV figures at all), or a hosted API's: no engine's at all
# (the default in the hosted-API mode; only the simulator's own counters).
MetricNames = Literal["both", "sglang", "vllm", "llamacpp", "hosted"]
METRIC_NAMES: tuple[MetricNames, ...] = ("both", "sglang", "vllm", "llamacpp", "hosted")
# What a hosted API charges a chat request's reply to its token budgets at the start:
# `max_tokens` (OpenAI's estimate) or the reply it will generate (`usage`).
Charge = Literal["usage", "max_tokens"]
CHARGES: tuple[Charge, ...] = ("usage", "max_tokens")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineParams:
    """The batching model: KV pool, prefix cache blocks, batch cap and step costs."""

    kv_tokens: int = 32768
    block_size: int = 16
    max_running: int = 64
    max_prefill_tokens: int = 16384
    prefill_ms_per_token: float = CALIBRATED_PREFILL_MS_PER_TOKEN
    decode_base_ms: float = CALIBRATED_DECODE_BASE_MS
    decode_ms_per_seq: float = CALIBRATED_DECODE_MS_PER_SEQ
    priority_order: PriorityOrder = "off"
    # With a priority order: a waiting request that cannot start preempts running ones whose
    # priority is worse by more than this (SGLang's --priority-scheduling-preemption-threshold,
    # 10 by default there). None: a running request keeps its slot whatever arrives (vLLM).
    preempt_threshold: int | None = None
    admission: Admission = "reserve"
    # `ondemand`: the share of its reply reserve (min(max_tokens, reserve_cap)) a waiting
    # request must find free beside its prompt to start (1: all of it; 0: the prompt alone).
    reply_reserve: float = 1.0
    reserve_cap: int | None = None
    prefix_cache: Granularity = "block"
    eviction: Eviction = "lru"
    chunked_prefill: ChunkedPrefill = "off"
    chunk_tokens: int = 8192

    def __post_init__(self) -> None:
        if self.admission not in ADMISSIONS:
            raise ValueError("admission must be reserve, sglang or ondemand")
        if self.prefix_cache not in GRANULARITIES:
            raise ValueError("prefix_cache must be block, message or none")
        if self.eviction not in EVICTIONS:
            raise ValueError("eviction must be lru or fifo")
        if self.chunked_prefill not in CHUNKED_PREFILLS:
            raise ValueError("chunked_prefill must be off, mixed or separate")
        if self.chunk_tokens < 1:
            raise ValueError("chunk_tokens must be >= 1")
        if not 0.0 <= self.reply_reserve <= 1.0:
            raise ValueError("reply_reserve must be within 0..1")
        if self.reserve_cap is not None and self.reserve_cap < 1:
            raise ValueError("reserve_cap must be >= 1 when given")
        if self.priority_order not in ("off", "low-first", "high-first"):
            raise ValueError("priority_order must be off, low-first or high-first")
        if self.preempt_threshold is not None:
            if self.priority_order == "off":
                raise ValueError("preemption needs a priority order")
            if self.preempt_threshold < 0:
                raise ValueError("preempt_threshold must be >= 0")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.kv_tokens < self.block_size:
            raise ValueError("kv_tokens must hold at least one block")
        if self.max_running < 1 or self.max_prefill_tokens < 1:
            raise ValueError("max_running and max_prefill_tokens must be >= 1")
        if min(self.prefill_ms_per_token, self.decode_base_ms, self.decode_ms_per_seq) < 0:
            raise ValueError("step costs must be >= 0")

    @property
    def total_blocks(self) -> int:
        return self.kv_tokens // self.block_size

    @property
    def pool_tokens(self) -> int:
        """The KV pool in tokens, whole blocks only (SGLang's max_total_num_tokens)."""
        return self.total_blocks * self.block_size

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold `tokens` tokens."""
        return -(-tokens // self.block_size)

    def reply_reserve_tokens(self, max_new: int) -> int:
        """`ondemand`: reply tokens a waiting request must find room for beside its prompt."""
        capped = max_new if self.reserve_cap is None else min(max_new, self.reserve_cap)
        return int(capped * self.reply_reserve)

    def step_ms(self, *, prefill_tokens: int, decoding: int) -> float:
        """Duration of one engine iteration: prefill of new requests plus one decode step."""
        decode = self.decode_base_ms + self.decode_ms_per_seq * decoding if decoding else 0.0
        return prefill_tokens * self.prefill_ms_per_token + decode


@dataclass(frozen=True, slots=True, kw_only=True)
class SimParams:
    """Everything the HTTP shell needs on top of the batching model."""

    engine: EngineParams = EngineParams()
    replica_id: str = "engine"
    model: str = "luftpause-sim"
    kind: Kind = "generative"
    time_scale: float = 1.0
    tool_rounds: int = 3
    tool_style: ToolStyle = "openai"
    reply_tokens: int = 64
    default_max_tokens: int = 256
    labels: tuple[str, ...] = ("urgent", "lookup", "chitchat")
    # Hosted-API mode: budgets per window of requests, tokens, input and output tokens.
    rpm: int | None = None
    tpm: int | None = None
    itpm: int | None = None
    otpm: int | None = None
    rate_window_s: float = 60.0
    rate_limit_regime: Regime = "fixed"
    rate_limit_charge: Charge = "max_tokens"
    rate_limit_headers: HeaderFamily = "openai"
    require_key: str | None = None
    # Tokens per streamed chunk after the first (SGLang's --stream-interval).
    stream_interval: int = 1
    # Answer llama.cpp's slot save/restore calls (as llama-server with --slot-save-path).
    slot_saves: bool = False
    debug_log_size: int = 1000
    # The context window in tokens: a chat request whose prompt plus max_tokens is longer gets
    # OpenAI's 400 `context_length_exceeded`, and /v1/models says it (`max_model_len`).
    context_window: int | None = None
    # What the engine tells about itself: the metric names on /metrics, and SGLang's
    # /server_info (404 when off).
    metrics: MetricNames = "both"
    server_info: bool = True

    def __post_init__(self) -> None:
        if self.time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        if self.tool_rounds < 0 or self.reply_tokens < 1 or self.default_max_tokens < 1:
            raise ValueError("tool_rounds >= 0, reply_tokens >= 1, default_max_tokens >= 1")
        if self.tool_style not in TOOL_STYLES:
            raise ValueError("tool_style must be openai or text")
        if self.stream_interval < 1:
            raise ValueError("stream_interval must be >= 1")
        if len(self.labels) < 2:
            raise ValueError("single-pass needs at least two labels")
        if self.context_window is not None and self.context_window < 1:
            raise ValueError("context_window must be >= 1 when given")
        if self.metrics not in METRIC_NAMES:
            raise ValueError("metrics must be both, sglang, vllm, llamacpp or hosted")
        self._check_rate_limits()

    def _check_rate_limits(self) -> None:
        for name, limit in self.rate_limits.items():
            if limit is not None and limit < 1:
                raise ValueError(f"{name} must be >= 1 when given")
        if not self.rate_window_s > 0:
            raise ValueError("rate_window_s must be > 0")
        if self.rate_limit_regime not in REGIMES:
            raise ValueError("rate_limit_regime must be fixed or continuous")
        if self.rate_limit_charge not in CHARGES:
            raise ValueError("rate_limit_charge must be usage or max_tokens")
        if self.rate_limit_headers not in HEADER_FAMILIES:
            raise ValueError("rate_limit_headers must be openai or anthropic")

    @property
    def rate_limits(self) -> dict[str, int | None]:
        """The hosted-API budgets by flag (rpm, tpm, itpm, otpm); None: no such budget."""
        return {"rpm": self.rpm, "tpm": self.tpm, "itpm": self.itpm, "otpm": self.otpm}

    @property
    def hosted(self) -> bool:
        return any(limit is not None for limit in self.rate_limits.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """A named set of engine parameters: the defaults `luftpause fake-engine --profile` starts
    from before any other flag."""

    name: str
    about: str
    engine: EngineParams
    stream_interval: int = 1


CPU_PROFILE = Profile(
    name="cpu",
    about="llama.cpp on one CPU thread, measured",
    engine=EngineParams(),
)
GPU_PROFILE = Profile(
    name="gpu",
    about="a small GPU running SGLang, not measured",
    engine=EngineParams(
        admission="sglang",
        prefill_ms_per_token=0.1,
        decode_base_ms=15.0,
        decode_ms_per_seq=0.3,
        max_running=48,
        kv_tokens=96000,
    ),
    stream_interval=1,
)
PROFILES: dict[str, Profile] = {p.name: p for p in (CPU_PROFILE, GPU_PROFILE)}
