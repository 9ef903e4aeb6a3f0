"""Endpoint configuration: the one file that lists the engine pool.

Pure module apart from `load_config`, which reads a file. The scheduler uses it to know the
replicas it places turns on and probes; the dataplane uses it to find the API key to send to a
replica; `luftpause up` writes one for the local stack.

File format (YAML, or TOML by extension)::

    endpoints:
      - id: engine-a                 # unique replica id
        url: http://127.0.0.1:9001   # base URL, no /v1
        models: [luftpause-sim]      # models it serves
        kind: generative             # or single-pass
        health: /health              # health path, probed every 2 s
        metrics: /metrics            # load path; "" when the endpoint reports no load
        api_key_env: ENGINE_A_KEY    # environment variable holding its API key (optional)
        load_from: [engine-x]        # a router: read its load from these (optional, see below)
        priority: {interactive: 0, batch: 100, preemptive: true}  # see below (optional)
        slots: 4                     # llama.cpp's --parallel: luftpause picks the slot (optional)
        slot_saves: 8                # contexts saved on the engine's disk (optional, see below)
        kv_tokens: 200000            # the engine's KV pool in tokens (optional, see below)
        max_running: 256             # the most requests it runs at once (optional, see below)
        limits: {tpm: 200000}        # a hosted API's rate limits (optional, `common.limits`)
        apis: [chat, messages]       # the APIs the engine serves itself (optional, see below)
        key_header: x-api-key        # where its API key goes: authorization (Bearer) or x-api-key

APIs the engine serves (`apis`). The dataplane takes turns on three APIs: OpenAI Chat
Completions (`chat`), Anthropic's Messages API (`messages`, Claude Code's) and OpenAI's
Responses API (`responses`, Codex's). A turn on an API the engine serves itself goes to it
unchanged and its reply comes back byte for byte (vLLM serves all three, llama.cpp's server
`chat` and `messages`, a hosted Anthropic API `messages` only); a turn on any other is
translated to Chat Completions and its reply back, event by event while it streams. Unset, an
engine serves `chat` only. Translation goes to Chat Completions only, so a turn placed on an
endpoint that serves neither its API nor `chat` is refused with 502. The endpoint's API key goes
as `Authorization: Bearer` (OpenAI, vLLM, llama.cpp) unless `key_header: x-api-key` says
Anthropic's header (its API takes a key there only).

Engine-side priority (`priority`). SGLang (`--enable-priority-scheduling`) and vLLM
(`--scheduling-policy priority`) order their own waiting queue by a `priority` field of the
request. With `priority` set, every turn placed on the endpoint carries the number given for
its class, replacing any the client sent; the engine then serves a queued interactive turn
before queued batch ones. Which end is first is the engine's convention (vLLM and SGLang with
`--schedule-low-priority-values-first`: lower first; SGLang by default: higher first), so the
file says the numbers, not an order. Without it no priority is sent.

`preemptive: true` says the engine also preempts: a waiting request that cannot start takes the
place of a running one of worse priority. SGLang does this with `--enable-priority-scheduling`
(unless `--disable-priority-preemption`) when the numbers differ by more than its
`--priority-scheduling-preemption-threshold` (10 by default), so give numbers further apart
than that. vLLM's priority policy (V1), as far as we know, preempts only when running requests
run out of KV blocks, not for an arrival, so leave it false there unless your version does.
On a preemptive endpoint batch turns need not keep slots for paused interactive runs, and an
interactive turn is placed even when the engine is full: the engine makes its room.

Engine slots (`slots`). Leave it unset for a llama.cpp build with its host-memory prompt cache
(`--cache-ram`, on by default in recent builds): a request that names no slot gets the idle slot
most like it, and the context it displaces is kept in host memory and loaded back when its run
returns, which did as well as naming slots with tool-calling agents and better with agents that
send tool results as plain messages (bench/results/matrix_slots.json; by llama.cpp's source, a
request naming an idle slot whose content is at least half a prefix of its prompt skips that
cache). Set it for builds without one.
llama.cpp's server keeps one conversation's KV cache per slot
(`--parallel N` slots) and, left to choose, gives a new request the idle slot whose content
shares the longest prefix with it. Runs that share a preamble all look alike to it, so a new run
often overwrites the slot of a run paused on a tool, which then reads its whole context again.
With `slots: N` (N = the server's `--parallel`), the scheduler keeps a table of which run each
slot holds: a turn goes back to its run's slot, else it takes the slot whose content will be
wanted again last (empty, a finished run's, then paused runs', batch before interactive; see
`scheduler.core.slots`), and the request carries llama.cpp's `id_slot`. At most N turns are in
flight there. Every turn to the engine must come through luftpause for the table to be right, and N
must be the engine's slot count: the scheduler's prober compares it with llama.cpp's `/props`
and logs a warning when they differ.

Saved contexts (`slot_saves`, with `slots`). When every slot holds a run that will come back, a
turn still has to take one of them, and the run it held reads its whole context again on its
next turn (llama.cpp's own prompt cache does not reliably keep it when runs share a preamble;
see `bench/slot_saves.py`). llama.cpp can save a slot's KV cache to a file and load it back into
any slot (`POST /slots/{id}?action=save|restore`, enabled by starting the server with
`--slot-save-path DIR`). With `slot_saves: K`, before a turn takes a slot whose run is paused on
a tool or has a turn held, the dataplane saves that slot to one of K files, and a run whose slot
was taken gets its context restored from its file before its next turn: milliseconds instead of
a second prefill. Which run each file holds is kept by the scheduler like the slots (a file goes
to the context wanted again soonest). The files are named `luftpause-<endpoint id>-<k>.bin`, and
luftpause overwrites them and never writes more than K per endpoint, so the engine's disk holds
at most K contexts' KV (llama.cpp has no call to delete one; remove them when the engine is
gone). A failed save or restore only costs the prefill: the turn goes on and the dataplane
counts it in `luftpause_dataplane_slot_actions`. llama.cpp checks a restored context's tokens
against the prompt, so a stale file is never used wrongly.

KV pool (`kv_tokens`). An engine that batches up to its KV memory (SGLang, vLLM) keeps a paused
run's prefix only while the contexts of the runs using it fit in that memory; past it, runs evict
each other's prefixes during their tool calls and every turn reads its whole context again. The
scheduler keeps each replica's resident runs (generating, paused on a tool, or idle but expected
back) within its KV pool by holding new runs while they would not fit (see
`scheduler.core.residency`). The pool is read from the engine's metrics (SGLang
`sglang:max_total_num_tokens`, vLLM `vllm:cache_config_info`); `kv_tokens` sets it for an engine
that does not export it, or overrides it. Without a known pool, new runs are never held for it.

An engine whose KV pool is known batches up to it: when it queues, the queue comes from its KV
being full or from the prefill it takes in per step, not from a limit on how many requests it
runs, so luftpause sets no turn cap from that queue (a cap at what it runs would keep it below
what it can batch). Only when it runs as many requests as it can at all does a queue cap it, at
that number: `max_running` (SGLang's `--max-running-requests`), read from the engine's
`/server_info` when the file does not say. An engine without a known pool (llama.cpp, or one that
exports no KV figures) is capped at what it runs once it queues, which fits engines limited by a
few slots.

Routers as backends (`load_from`). A replica may be a router (e.g. the SGLang router) that picks
the engine itself; the router's own metrics say nothing about the queue, so its load is read from
the engines behind it. Each `load_from` entry is either

- the id of another endpoint in the same file: its `url` + its own `metrics` path is read, with
  its own API key (it must have a metrics path, and it must not be the router itself); or
- the base URL of an engine that is not a replica itself, ``http(s)://host[:port][/prefix]``:
  ``<url>/metrics`` is read, with no API key (keys go only where an endpoint names them).

The router's load (running, waiting) is the sum over the entries that answer with known metric
names; when none does, it reports no load (never capped). Its health is still its own `health`
path. For example::

    endpoints:
      - id: router
        url: http://sglang-router:30000
        models: [llama]
        load_from: [http://gpu-0:30001, http://gpu-1:30001]

An https `url` is verified against the system's CA store; a private CA is trusted through the
standard `SSL_CERT_FILE` (or `SSL_CERT_DIR`) environment variable, read when the process starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from luftpause.common.files import load_structured
from luftpause.common.limits import Limits, LimitsError, parse_limits


class ConfigError(ValueError):
    """The endpoint configuration is invalid; the message says where."""


# The APIs an endpoint may serve itself (`apis`): Chat Completions, Anthropic's Messages API,
# OpenAI's Responses API.
APIS = ("chat", "messages", "responses")
DEFAULT_APIS = frozenset({"chat"})
KEY_HEADERS = ("authorization", "x-api-key")


class EndpointKind(StrEnum):
    GENERATIVE = "generative"
    SINGLE_PASS = "single-pass"


@dataclass(frozen=True, slots=True, kw_only=True)
class Priorities:
    """The `priority` value an endpoint's engine gets for a turn of each class."""

    interactive: int
    batch: int
    # The engine preempts a running batch turn for a waiting interactive one.
    preemptive: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """One replica of the pool (an engine, a router, or a hosted API)."""

    id: str
    url: str
    models: frozenset[str]
    kind: EndpointKind = EndpointKind.GENERATIVE
    health: str = "/health"
    metrics: str = "/metrics"
    api_key_env: str = ""
    load_from: tuple[str, ...] = ()
    priority: Priorities | None = None
    # Engine slots luftpause assigns (llama.cpp's --parallel); 0: the engine picks.
    slots: int = 0
    # Slot contexts saved to the engine's disk and restored (llama.cpp --slot-save-path); 0: none.
    slot_saves: int = 0
    # The engine's KV pool in tokens; 0: read it from the engine's metrics (SGLang, vLLM).
    kv_tokens: int = 0
    # The most requests the engine runs at once; 0: ask the engine (SGLang's /server_info).
    max_running: int = 0
    # A hosted API's stated rate limits (`common.limits`); None: learned from its replies.
    limits: Limits | None = None
    # The APIs the engine serves itself (`APIS`); the dataplane translates the others to chat.
    apis: frozenset[str] = DEFAULT_APIS
    # The header its API key goes in (`KEY_HEADERS`): a bearer, or Anthropic's x-api-key.
    key_header: str = "authorization"

    def __post_init__(self) -> None:
        if not self.id:
            raise ConfigError("endpoint id must not be empty")
        if self.slots < 0:
            raise ConfigError(f"endpoint {self.id}: slots must be >= 0")
        if self.slots and self.kind is not EndpointKind.GENERATIVE:
            raise ConfigError(f"endpoint {self.id}: slots are for generative endpoints")
        if self.slot_saves < 0:
            raise ConfigError(f"endpoint {self.id}: slot_saves must be >= 0")
        if self.slot_saves and not self.slots:
            raise ConfigError(f"endpoint {self.id}: slot_saves needs slots (saves are per slot)")
        if self.kv_tokens < 0:
            raise ConfigError(f"endpoint {self.id}: kv_tokens must be >= 0")
        if self.kv_tokens and self.kind is not EndpointKind.GENERATIVE:
            raise ConfigError(f"endpoint {self.id}: kv_tokens is for generative endpoints")
        if self.max_running < 0:
            raise ConfigError(f"endpoint {self.id}: max_running must be >= 0")
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(
                f"endpoint {self.id}: url must be http(s)://host[:port], got {self.url!r}"
            )
        if not self.models:
            raise ConfigError(f"endpoint {self.id}: models must list at least one model")
        if not self.apis or not self.apis <= set(APIS):
            raise ConfigError(
                f"endpoint {self.id}: apis must list some of {', '.join(APIS)}, "
                f"got {sorted(self.apis)}"
            )
        if self.key_header not in KEY_HEADERS:
            raise ConfigError(
                f"endpoint {self.id}: key_header must be authorization or x-api-key, "
                f"got {self.key_header!r}"
            )
        for path in (self.health, self.metrics):
            if path and not path.startswith("/"):
                raise ConfigError(f"endpoint {self.id}: paths must start with '/', got {path!r}")

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/")

    def api_key(self, environ: Mapping[str, str] | None = None) -> str:
        """The key to send upstream, read from the named environment variable ('' if none)."""
        if not self.api_key_env:
            return ""
        return (os.environ if environ is None else environ).get(self.api_key_env, "")


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    endpoints: tuple[Endpoint, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        ids = [e.id for e in self.endpoints]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ConfigError(f"duplicate endpoint ids: {', '.join(dupes)}")
        by_id = {e.id: e for e in self.endpoints}
        for e in self.endpoints:
            _check_load_from(e, by_id)

    def endpoint(self, endpoint_id: str) -> Endpoint | None:
        return next((e for e in self.endpoints if e.id == endpoint_id), None)

    def generative_models(self) -> tuple[str, ...]:
        """The models the generative endpoints serve, sorted, each once."""
        generative = (e for e in self.endpoints if e.kind is EndpointKind.GENERATIVE)
        return tuple(sorted({m for e in generative for m in e.models}))


def is_base_url(value: str) -> bool:
    """True for an http(s) URL with a host, as a `load_from` entry that is not an endpoint id."""
    parts = urlsplit(value)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError:
        return False
    return (
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and not parts.query
        and not parts.fragment
    )


def _check_load_from(endpoint: Endpoint, by_id: Mapping[str, Endpoint]) -> None:
    where = f"endpoint {endpoint.id}: load_from"
    seen: set[str] = set()
    for entry in endpoint.load_from:
        if entry in seen:
            raise ConfigError(f"{where} lists {entry!r} twice (its load would count twice)")
        seen.add(entry)
        if entry == endpoint.id:
            raise ConfigError(f"{where} names the endpoint itself; list the engines behind it")
        target = by_id.get(entry)
        if target is not None:
            if not target.metrics:
                raise ConfigError(
                    f"{where} names endpoint {entry!r}, which has no metrics path to read"
                )
        elif not is_base_url(entry):
            raise ConfigError(
                f"{where} entry {entry!r} is neither an endpoint id in this file nor an "
                "http(s)://host[:port] URL"
            )


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of strings")
    return tuple(value)


def parse_endpoint(raw: Mapping[str, Any], index: int) -> Endpoint:
    """Build an Endpoint from one mapping of the file."""
    where = f"endpoints[{index}]"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping")
    unknown = set(raw) - {
        "id",
        "url",
        "models",
        "kind",
        "health",
        "metrics",
        "api_key_env",
        "load_from",
        "priority",
        "slots",
        "slot_saves",
        "kv_tokens",
        "max_running",
        "limits",
        "apis",
        "key_header",
    }
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    try:
        kind = EndpointKind(raw.get("kind", "generative"))
    except ValueError as exc:
        raise ConfigError(f"{where}: kind must be generative or single-pass") from exc
    return Endpoint(
        id=str(raw.get("id", "")),
        url=str(raw.get("url", "")),
        models=frozenset(_str_list(raw.get("models", []), f"{where}.models")),
        kind=kind,
        health=str(raw.get("health", "/health")),
        metrics=str(raw.get("metrics", "/metrics")),
        api_key_env=str(raw.get("api_key_env", "")),
        load_from=_str_list(raw.get("load_from", []), f"{where}.load_from"),
        priority=_priorities(raw.get("priority"), f"{where}.priority"),
        slots=_count(raw.get("slots", 0), f"{where}.slots"),
        slot_saves=_count(raw.get("slot_saves", 0), f"{where}.slot_saves"),
        kv_tokens=_count(raw.get("kv_tokens", 0), f"{where}.kv_tokens"),
        max_running=_count(raw.get("max_running", 0), f"{where}.max_running"),
        limits=_limits(raw.get("limits"), f"{where}.limits"),
        apis=frozenset(_str_list(raw.get("apis", sorted(DEFAULT_APIS)), f"{where}.apis")),
        key_header=str(raw.get("key_header", "authorization")).lower(),
    )


def _limits(value: Any, where: str) -> Limits | None:
    try:
        return parse_limits(value, where)
    except LimitsError as exc:
        raise ConfigError(str(exc)) from None


def _count(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{where} must be a whole number >= 0, got {value!r}")
    return value


def _priorities(value: Any, where: str) -> Priorities | None:
    if value is None:
        return None
    if (
        not isinstance(value, Mapping)
        or not {"interactive", "batch"} <= set(value)
        or not set(value) <= {"interactive", "batch", "preemptive"}
    ):
        raise ConfigError(
            f"{where} must be a mapping with 'interactive' and 'batch' (and 'preemptive')"
        )
    numbers = {k: v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}
    if "interactive" not in numbers or "batch" not in numbers:
        raise ConfigError(f"{where}: 'interactive' and 'batch' must be integers")
    preemptive = value.get("preemptive", False)
    if not isinstance(preemptive, bool):
        raise ConfigError(f"{where}: 'preemptive' must be true or false")
    return Priorities(
        interactive=numbers["interactive"], batch=numbers["batch"], preemptive=preemptive
    )


def parse_config(raw: Any) -> Config:
    """Build a Config from the file's parsed content."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("endpoints"), list):
        raise ConfigError("config must be a mapping with an 'endpoints' list")
    return Config(endpoints=tuple(parse_endpoint(e, i) for i, e in enumerate(raw["endpoints"])))


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML or TOML endpoint file."""
    return parse_config(load_structured(path, "config", ConfigError))
