"""The rate-limit benchmark's scenarios, limits and workload, its arms' settings, and its ideal
schedule.

Pure module: values and arithmetic; no I/O, no clock reads, randomness only from a seed.

A scenario is one or two simulated hosted APIs (`Provider`, each with its own budgets per
window of `window_s` simulated seconds), a refill regime, a header family and a workload size.
The default scenarios run in real time (time scale 1: a window is a real minute, as LiteLLM and
a user count it) with a workload of a few windows; the `stress-` scenarios are the earlier
time-scaled ones (time scale 6: 10-second windows, twice the agents, longer tasks), a stress
test of the admission rather than a comparison with LiteLLM, whose per-minute counters cannot
bind there.

A scenario's workload is a fixed set of agents per seed (`plan_agents`): each agent runs one task of
several tool rounds; its task size, its rounds, their tool times and tool-result sizes are drawn
from `random.Random(f"{seed}/{agent}")`, so every arm of a seed does the same work. Times in a
plan are simulated seconds; the agents sleep them divided by the time scale.

The ideal schedule (`ideal_seconds`) is the time the budgets alone need for the tokens and
requests the agents were charged: for each budget, what was charged over the limit of all
providers together, in windows; the largest of these, in real seconds. Budgets start whole, so
the work can end a window sooner (`earliest_seconds`): an arm may beat the ideal.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The budgets a provider may have, by the simulator's flag, and what each counts.
BUDGETS = ("rpm", "tpm", "itpm", "otpm")
COUNTS = {"rpm": "requests", "tpm": "tokens", "itpm": "input_tokens", "otpm": "output_tokens"}
ARMS = ("direct", "direct-patient", "litellm", "luftpause", "luftpause-limits")
ARM_ABOUT = {
    "direct": "the agents' clients straight at the providers, the openai package's defaults "
    "(2 retries, honouring Retry-After); two providers: turns split by budget",
    "direct-patient": "the same with a patient client: 30 retries honouring Retry-After",
    "litellm": "the LiteLLM proxy configured as its docs advise for rate-limited deployments "
    "(rpm/tpm per deployment, usage-based-routing-v2, num_retries, allowed_fails, "
    "cooldown_time); clients with the openai defaults",
    "luftpause": "scheduler and dataplane, the endpoints given without `limits` (as a new user "
    "writes them); clients with the openai defaults",
    "luftpause-limits": "the same with `limits: {}` on each endpoint (rate-limited from the "
    "start, learned from the headers)",
}
OPENAI_DEFAULT_RETRIES = 2  # openai.DEFAULT_MAX_RETRIES
PATIENT_RETRIES = 30  # a fixed window is at most a few Retry-Afters away
# LiteLLM's router for a rate-limited deployment, as its docs set it: the strategy that
# keeps each deployment under its rpm/tpm ("when you want to respect rate limits"), retries of
# a failed call (honouring the provider's Retry-After up to 60 s), and a deployment taken out
# of routing for `cooldown_time` seconds after `allowed_fails` failures in a minute (LiteLLM
# never cools down the only deployment of a model group).
LITELLM_ROUTER: dict[str, object] = {
    "routing_strategy": "usage-based-routing-v2",
    "num_retries": 3,
    "allowed_fails": 3,
    "cooldown_time": 30,
}
CHARS_PER_TOKEN = 4  # the simulator's tokenizer
# Words for the agents' text: English, so LiteLLM's tokenizer counts about what the simulator
# does (four characters a token).
_VOCABULARY = (
    "budget window token agent lookup result context request provider reply tool turn "
    "schedule minute refill bucket header retry wait model prompt answer search table"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Provider:
    """A simulated hosted API: its id and its budgets per window (None: no such budget)."""

    id: str
    rpm: int | None = None
    tpm: int | None = None
    itpm: int | None = None
    otpm: int | None = None

    def __post_init__(self) -> None:
        if all(self.limit(b) is None for b in BUDGETS):
            raise ValueError(f"provider {self.id} has no budget")
        if any((v := self.limit(b)) is not None and v < 1 for b in BUDGETS):
            raise ValueError(f"provider {self.id}: a budget is >= 1")

    def limit(self, budget: str) -> int | None:
        value: int | None = getattr(self, budget)
        return value

    def limits(self) -> dict[str, int]:
        """The budgets it has, by flag."""
        return {b: v for b in BUDGETS if (v := self.limit(b)) is not None}

    def per_real_minute(self, window_real_s: float) -> dict[str, int]:
        """Its budgets restated per minute of real time (what a user writes in a config)."""
        return {b: round(v * 60.0 / window_real_s) for b, v in self.limits().items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """The sizes of an agent's task, drawn uniformly from these ranges (inclusive). The
    defaults are the real-time workload: about 2,800 tokens an agent over 2-4 turns."""

    task_tokens: tuple[int, int] = (300, 900)
    rounds: tuple[int, int] = (1, 3)
    tool_s: tuple[float, float] = (1.0, 4.0)  # simulated seconds per tool call
    result_tokens: tuple[int, int] = (50, 250)
    start_s: tuple[float, float] = (0.0, 3.0)  # simulated seconds before the first turn
    max_tokens: int = 128


# The time-scaled stress workload (the earlier default): longer tasks, more rounds.
STRESS_SHAPE = Shape(
    task_tokens=(1200, 3600),
    rounds=(2, 5),
    tool_s=(2.0, 8.0),
    result_tokens=(100, 600),
    start_s=(0.0, 4.0),
    max_tokens=256,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """One comparison: the providers, how their budgets refill and report, the workload."""

    name: str
    about: str
    providers: tuple[Provider, ...]
    regime: str = "fixed"
    headers: str = "openai"
    charge: str = "usage"
    agents: int = 8
    time_scale: float = 1.0
    window_s: float = 60.0  # simulated seconds
    shape: Shape = field(default_factory=Shape)

    def __post_init__(self) -> None:
        if self.regime not in ("fixed", "continuous"):
            raise ValueError("the regime is fixed or continuous")
        if self.headers not in ("openai", "anthropic"):
            raise ValueError("the headers are openai or anthropic")
        if self.charge not in ("usage", "max_tokens") or not self.providers or self.agents < 1:
            raise ValueError("charge is usage or max_tokens; at least one provider and agent")

    @property
    def window_real_s(self) -> float:
        return self.window_s / self.time_scale

    @property
    def stress(self) -> bool:
        """Time-scaled: its windows are shorter than a real minute."""
        return self.time_scale != 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolRound:
    tool_s: float  # simulated seconds
    result_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentPlan:
    """One agent's task: when it starts (simulated s), its opening size, its tool rounds."""

    agent: int
    start_s: float
    task_tokens: int
    rounds: tuple[ToolRound, ...]

    @property
    def turns(self) -> int:
        return len(self.rounds) + 1


def plan_agents(seed: int, agents: int, shape: Shape) -> tuple[AgentPlan, ...]:
    """The agents of one seed; the same seed and shape give the same plans."""
    plans = []
    for agent in range(agents):
        rng = random.Random(f"{seed}/{agent}")
        rounds = tuple(
            ToolRound(
                tool_s=round(rng.uniform(*shape.tool_s), 3),
                result_tokens=rng.randint(*shape.result_tokens),
            )
            for _ in range(rng.randint(*shape.rounds))
        )
        plans.append(
            AgentPlan(
                agent=agent,
                start_s=round(rng.uniform(*shape.start_s), 3),
                task_tokens=rng.randint(*shape.task_tokens),
                rounds=rounds,
            )
        )
    return tuple(plans)


def text(seed: str, tokens: int) -> str:
    """`tokens` tokens' worth of words (the simulator's count), the same for the same seed."""
    rng = random.Random(seed)
    words = _VOCABULARY.split()
    chars = tokens * CHARS_PER_TOKEN
    out: list[str] = []
    length = 0
    while length < chars:
        word = rng.choice(words)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:chars]


def rough_tokens(plan: AgentPlan, reply_tokens: int = 64, call_tokens: int = 30) -> int:
    """About what an agent's turns charge (prompts grow by each call and result): for sizing."""
    total = 0
    prompt = plan.task_tokens + 100  # the tool schema and the chat template
    for r in plan.rounds:
        total += prompt + call_tokens
        prompt += call_tokens + r.result_tokens + 10
    return total + prompt + reply_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class Charged:
    """What the agents' completed turns were charged, by `COUNTS` name."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def of(self, budget: str) -> int:
        return {
            "rpm": self.requests,
            "tpm": self.tokens,
            "itpm": self.input_tokens,
            "otpm": self.output_tokens,
        }[budget]


def ideal_seconds(charged: Charged, providers: Sequence[Provider], window_real_s: float) -> float:
    """Real seconds the budgets of all `providers` together need for `charged` at their rate
    (what was charged over the limits, in windows); a budget some provider lacks binds
    nothing."""
    return _windows(charged, providers, lambda x: x) * window_real_s


def earliest_seconds(
    charged: Charged,
    providers: Sequence[Provider],
    window_real_s: float,
    regime: str,
    phase_s: float = 0.0,
) -> float:
    """The earliest the budgets let `charged` finish: they start whole, so one window less
    than the ideal (continuous), or than the whole windows it spans (fixed); a run that starts
    `phase_s` into a fixed window meets each boundary that much sooner."""
    span = (lambda x: float(math.ceil(x))) if regime == "fixed" else (lambda x: x)
    windows = max(0.0, _windows(charged, providers, span) - 1.0)
    if regime == "fixed" and windows > 0:
        return windows * window_real_s - phase_s
    return windows * window_real_s


def _windows(
    charged: Charged, providers: Sequence[Provider], span: Callable[[float], float]
) -> float:
    windows = 0.0
    for budget in BUDGETS:
        limits = [p.limit(budget) for p in providers]
        if any(v is None for v in limits):
            continue
        windows = max(windows, span(charged.of(budget) / sum(v for v in limits if v is not None)))
    return windows


def sim_flags(scenario: Scenario, provider: Provider) -> list[str]:
    """The simulator's hosted-mode flags for `provider` in `scenario`."""
    flags = [f"--{b}={v}" for b, v in provider.limits().items()]
    return [
        *flags,
        *("--rate-limit-regime", scenario.regime, "--rate-limit-headers", scenario.headers),
        *("--rate-limit-window-s", f"{scenario.window_s:g}"),
        *("--rate-limit-charge", scenario.charge, "--time-scale", f"{scenario.time_scale:g}"),
    ]


def litellm_limits(provider: Provider, window_real_s: float) -> dict[str, int]:
    """The `rpm`/`tpm` a LiteLLM user sets for `provider`: its limits per real minute. LiteLLM
    has one token budget (input and output together): for a provider with input and output
    budgets, the input budget, the one the agents' long prompts spend first."""
    minute = provider.per_real_minute(window_real_s)
    out = {"rpm": minute["rpm"]} if "rpm" in minute else {}
    tokens = minute.get("tpm", minute.get("itpm"))
    if tokens is not None:
        out["tpm"] = tokens
    return out


def stated_limits(provider: Provider, window_real_s: float, charge: str) -> dict[str, object]:
    """The endpoint file's `limits:` for `provider`: its budgets per window of
    `window_real_s` real seconds (`window_s`), as its simulator counts them."""
    return {**provider.limits(), "window_s": window_real_s, "charges": charge}


def litellm_config(scenario: Scenario, bases: Sequence[str], model: str) -> dict[str, Any]:
    """LiteLLM's proxy config: one model name, a deployment per provider (at its base URL with
    /v1) with its rpm and tpm, and the router's settings (`LITELLM_ROUTER`)."""
    deployments = []
    for provider, base in zip(scenario.providers, bases, strict=True):
        params: dict[str, Any] = {"model": f"openai/{model}", "api_base": base, "api_key": "x"}
        params.update(litellm_limits(provider, scenario.window_real_s))
        deployments.append({"model_name": model, "litellm_params": params})
    return {"model_list": deployments, "router_settings": dict(LITELLM_ROUTER)}


def client_retries(arm: str) -> int:
    """The `max_retries` of the agents' openai clients in `arm`: the package's default, but
    for the patient direct client."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}")
    return PATIENT_RETRIES if arm == "direct-patient" else OPENAI_DEFAULT_RETRIES


def budget_weights(providers: Sequence[Provider]) -> tuple[int, ...]:
    """Each provider's share of the turns a client splits by budget: its token budget per
    window (input tokens where it has no total), or its request budget where it has neither."""
    weights = []
    for p in providers:
        weight = p.limit("tpm") or p.limit("itpm") or p.limit("rpm")
        if weight is None:
            raise ValueError(f"provider {p.id} has no token or request budget to split by")
        weights.append(weight)
    return tuple(weights)


def split_pick(credit: Sequence[float], weights: Sequence[int]) -> tuple[int, tuple[float, ...]]:
    """Smooth weighted round robin: the provider the next turn goes to and the new credit
    (start from zeros). Over any run of turns each provider's count stays within one of its
    weight's share, and the picks interleave instead of coming in blocks."""
    if len(credit) != len(weights) or not weights or min(weights) < 1:
        raise ValueError("one credit per weight; weights >= 1")
    grown = [c + w for c, w in zip(credit, weights, strict=True)]
    chosen = max(range(len(grown)), key=lambda i: (grown[i], -i))
    grown[chosen] -= sum(weights)
    return chosen, tuple(grown)


def usage_split(items: Mapping[str, int]) -> Charged:
    """A `Charged` from summed usage fields (prompt_tokens, completion_tokens, requests)."""
    return Charged(
        requests=items.get("requests", 0),
        input_tokens=items.get("prompt_tokens", 0),
        output_tokens=items.get("completion_tokens", 0),
    )


# --- the scenarios --------------------------------------------------------------------------------

_ONE = (Provider(id="p0", rpm=30, tpm=15_000),)
_STRESS_ONE = (Provider(id="p0", rpm=120, tpm=60_000),)
_REAL = (
    Scenario(
        name="fixed-openai",
        about="one provider, budgets whole again at each window boundary, OpenAI headers",
        providers=_ONE,
    ),
    Scenario(
        name="continuous-openai",
        about="one provider, budgets refilled continuously (token bucket), OpenAI headers",
        providers=_ONE,
        regime="continuous",
    ),
    Scenario(
        name="continuous-anthropic",
        about="one provider with input and output token budgets, token bucket, Anthropic headers",
        providers=(Provider(id="p0", rpm=30, itpm=14_000, otpm=800),),
        regime="continuous",
        headers="anthropic",
    ),
    Scenario(
        name="two-providers",
        about="two providers serving one model, one with twice the other's budget, token "
        "buckets, OpenAI headers",
        providers=(
            Provider(id="p0", rpm=30, tpm=10_000),
            Provider(id="p1", rpm=30, tpm=5_000),
        ),
        regime="continuous",
    ),
)


def _stressed(scenario: Scenario) -> Scenario:
    """The time-scaled stress version of a real-time scenario: 16 agents with the longer
    tasks at time scale 6 (8 agents for Anthropic's budgets), four times the budgets."""
    limits = {
        "fixed-openai": _STRESS_ONE,
        "continuous-openai": _STRESS_ONE,
        "continuous-anthropic": (Provider(id="p0", rpm=60, itpm=30_000, otpm=1_500),),
        "two-providers": (
            Provider(id="p0", rpm=120, tpm=40_000),
            Provider(id="p1", rpm=120, tpm=20_000),
        ),
    }[scenario.name]
    return Scenario(
        name=f"stress-{scenario.name}",
        about=f"{scenario.about}; time-scaled stress run",
        providers=limits,
        regime=scenario.regime,
        headers=scenario.headers,
        charge=scenario.charge,
        agents=8 if scenario.headers == "anthropic" else 16,
        time_scale=6.0,
        window_s=scenario.window_s,
        shape=STRESS_SHAPE,
    )


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (*_REAL, *map(_stressed, _REAL))}
DEFAULT_SCENARIOS = tuple(s.name for s in _REAL)
STRESS_SCENARIOS = tuple(f"stress-{s.name}" for s in _REAL)


def quick(scenario: Scenario, agents: int = 4, time_scale: float = 20.0) -> Scenario:
    """The scenario with fewer agents and faster time, its budgets cut in proportion."""
    cut = agents / scenario.agents
    providers = tuple(
        Provider(id=p.id, **{b: max(1, round(v * cut)) for b, v in p.limits().items()})
        for p in scenario.providers
    )
    return Scenario(
        name=scenario.name,
        about=scenario.about,
        providers=providers,
        regime=scenario.regime,
        headers=scenario.headers,
        charge=scenario.charge,
        agents=agents,
        time_scale=time_scale,
        window_s=scenario.window_s,
        shape=scenario.shape,
    )
