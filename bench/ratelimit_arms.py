"""The rate-limit benchmark's arms: fresh simulated providers, and what each arm puts in front.

Shell module (child processes, loopback HTTP). Every arm of every seed gets fresh simulators
(`luftpause fake-engine` in hosted mode, the scenario's limits, GPU-class step costs, tool calls
scripted while tools are offered) and a fresh front, all started by one `Launcher` and stopped
when the caller's exit stack closes:

- `direct`: nothing; the agents' clients point at the providers themselves;
- `litellm`: the LiteLLM proxy, each provider a deployment of one model name with its `rpm` and
  `tpm` per real minute in `litellm_params`, and `routing_strategy: usage-based-routing-v2`, the
  strategy whose pre-call checks refuse a deployment over its rpm/tpm (LiteLLM's load-balancing
  docs: "when you want to respect rate limits");
- `luftpause`: a scheduler and a dataplane on an endpoint file listing the providers (with
  `limits: {}` (rate-limited from the start, learned from the replies' headers), or with
  `--stated-limits` the provider's limits per its window, `window_s` being the window in real
  time).

`align` starts a measurement at the start of a fixed window (the budgets whole, the simulators'
tallies zeroed), so every arm meets the same window boundaries.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.ratelimit_plan import Scenario, litellm_limits, sim_flags, stated_limits
from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.stack import SIM_MODEL, Endpoint, Launcher, write_endpoints
from luftpause.testkit.waits import local_url, until_status

# A GPU-class engine (bench/arms.py GPU_PROFILE) with room for every agent's context: the
# provider's budget, not its compute, is what the agents wait for.
ENGINE = ("--profile", "gpu", "--kv-tokens", "1000000", "--max-running", "64")
TOOL_ROUNDS = "100"  # a tool call whenever one is offered; the agent decides when to stop
PROBE_PERIOD_S = 0.5
LITELLM_ENV = {
    "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
    "LITELLM_TELEMETRY": "False",
    "LITELLM_LOG": "ERROR",
}


async def start_providers(launcher: Launcher, scenario: Scenario) -> list[Endpoint]:
    """A fresh simulator per provider of the scenario."""
    return [
        await launcher.engine(p.id, *ENGINE, "--tool-rounds", TOOL_ROUNDS, *sim_flags(scenario, p))
        for p in scenario.providers
    ]


async def start_front(
    arm: str,
    launcher: Launcher,
    scenario: Scenario,
    endpoints: Sequence[Endpoint],
    *,
    stated: bool = False,
) -> list[str]:
    """What `arm` puts in front of the providers; the base URLs (with /v1) agents talk to."""
    if arm == "direct":
        return [e.url + "/v1" for e in endpoints]
    if arm == "litellm":
        return [await _litellm(launcher, scenario, endpoints)]
    if arm == "luftpause":
        return [await _luftpause(launcher, scenario, endpoints, stated)]
    raise ValueError(f"unknown arm {arm!r}")


def litellm_config(scenario: Scenario, endpoints: Sequence[Endpoint]) -> dict[str, Any]:
    """LiteLLM's config: one model name, a deployment per provider with its rpm and tpm."""
    deployments = []
    for provider, endpoint in zip(scenario.providers, endpoints, strict=True):
        params: dict[str, Any] = {
            "model": f"openai/{SIM_MODEL}",
            "api_base": endpoint.url + "/v1",
            "api_key": "x",
        }
        params.update(litellm_limits(provider, scenario.window_real_s))
        deployments.append({"model_name": SIM_MODEL, "litellm_params": params})
    return {
        "model_list": deployments,
        "router_settings": {"routing_strategy": "usage-based-routing-v2"},
    }


async def _litellm(launcher: Launcher, scenario: Scenario, endpoints: Sequence[Endpoint]) -> str:
    config = launcher.workdir / "litellm.yaml"
    config.write_text(yaml.safe_dump(litellm_config(scenario, endpoints), sort_keys=False))
    port = free_port()
    exe = str(Path(sys.executable).with_name("litellm"))
    proc = Proc(
        ["--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        name="litellm",
        program=[exe],
        log_path=launcher.workdir / "litellm.log",
        env=LITELLM_ENV,
    )
    await proc.start()
    launcher.exits.push_async_callback(proc.stop)
    await proc.wait_http(local_url(port) + "/health/liveliness", timeout=120)
    return local_url(port) + "/v1"


def luftpause_endpoints(
    scenario: Scenario, endpoints: Sequence[Endpoint], stated: bool
) -> list[Endpoint]:
    """The endpoint file's entries, rate-limited from the start (`limits: {}`, learned from
    the replies' headers), or with the limits stated per window when `stated`."""
    if not stated:
        return [
            Endpoint(id=e.id, url=e.url, models=e.models, options={"limits": {}}) for e in endpoints
        ]
    return [
        Endpoint(
            id=e.id,
            url=e.url,
            models=e.models,
            options={"limits": stated_limits(p, scenario.window_real_s, scenario.charge)},
        )
        for p, e in zip(scenario.providers, endpoints, strict=True)
    ]


async def _luftpause(
    launcher: Launcher, scenario: Scenario, endpoints: Sequence[Endpoint], stated: bool
) -> str:
    config = write_endpoints(
        launcher.workdir / "endpoints.yaml", luftpause_endpoints(scenario, endpoints, stated)
    )
    scheduler = await launcher.scheduler(
        config, "--probe-period", str(PROBE_PERIOD_S), ready="/ready"
    )
    await until_status(
        scheduler.status_url,
        lambda st: all(r["healthy"] for r in st["replicas"]),
        "the scheduler to see every provider healthy",
    )
    dataplane = await launcher.dataplane(scheduler, config=config, ready="/ready")
    return dataplane.base_url


# --- the providers' side --------------------------------------------------------------------------


async def limits_of(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """A simulator's `GET /debug/limits`."""
    async with session.get(url + "/debug/limits") as resp:
        resp.raise_for_status()
        body: dict[str, Any] = await resp.json()
        return body


async def align(session: aiohttp.ClientSession, scenario: Scenario, urls: Sequence[str]) -> None:
    """Wait for the start of the next window (fixed regime) and zero every simulator's tally
    and budgets, so an arm starts as every other did."""
    if scenario.regime == "fixed":
        body = await limits_of(session, urls[0])
        wait = max(b["reset_s"] for b in body["budgets"].values())
        await asyncio.sleep(wait + 0.01)
    await asyncio.gather(*(_reset(session, u) for u in urls))


async def _reset(session: aiohttp.ClientSession, url: str) -> None:
    async with session.post(url + "/debug/reset") as resp:
        resp.raise_for_status()


def counts(body: dict[str, Any]) -> dict[str, int]:
    """The tally in a `/debug/limits` body: served, refused, billed and refused tokens."""
    tally = body["counts"]
    return {
        k: int(tally.get(k, 0)) for k in ("served", "refused", "billed_tokens", "refused_tokens")
    }
