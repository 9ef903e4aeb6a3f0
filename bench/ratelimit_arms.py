"""The rate-limit benchmark's arms: fresh simulated providers, and what each arm puts in front.

Shell module (child processes, loopback HTTP). Every arm of every seed gets fresh simulators
(`luftpause fake-engine` in hosted mode, the scenario's limits, GPU-class step costs, tool calls
scripted while tools are offered) and a fresh front, all started by one `Launcher` and stopped
when the caller's exit stack closes (`ratelimit_plan.ARM_ABOUT` says what each arm is):

- `direct`, `direct-patient`: nothing; the agents' clients point at the providers themselves;
- `litellm`: the LiteLLM proxy on `ratelimit_plan.litellm_config` (a deployment per provider
  with its rpm and tpm, the router settings of `LITELLM_ROUTER`);
- `luftpause`, `luftpause-limits`: a scheduler and a dataplane on an endpoint file listing the
  providers without `limits` (`luftpause`), or with `limits: {}` (`luftpause-limits`; with
  `stated` each provider's limits per its window instead).

The providers' ports are chosen first, so that a front that takes long to start (LiteLLM) starts
before them and the luftpause fronts, which probe them, after them: every arm then meets its
providers a few seconds after they started. `align` starts the measurement at the same point
of a fixed window for every arm (`ALIGN_PHASE_S` into it, the budgets whole and the simulators'
tallies zeroed).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.ratelimit_plan import Scenario, litellm_config, sim_flags, stated_limits
from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.stack import SIM_MODEL, Endpoint, Launcher, write_endpoints
from luftpause.testkit.waits import local_url, until_status

# A GPU-class engine (bench/arms.py GPU_PROFILE) with room for every agent's context: the
# provider's budget, not its compute, is what the agents wait for.
ENGINE = ("--profile", "gpu", "--kv-tokens", "1000000", "--max-running", "64")
TOOL_ROUNDS = "100"  # a tool call whenever one is offered; the agent decides when to stop
PROBE_PERIOD_S = 0.5
# Real seconds into a fixed window at which a measurement starts (room for the fronts to start
# after the providers; a front that takes longer waits for the next window).
ALIGN_PHASE_S = 15.0
LITELLM_ENV = {
    "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
    "LITELLM_TELEMETRY": "False",
    "LITELLM_LOG": "ERROR",
    # No internet here: its packaged model cost map, not three failed fetches at each start.
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}


def planned_providers(scenario: Scenario) -> list[Endpoint]:
    """An endpoint per provider of the scenario on a port free now (started by
    `start_providers`)."""
    return [
        Endpoint(id=p.id, url=local_url(free_port()), models=(SIM_MODEL,))
        for p in scenario.providers
    ]


async def start_providers(
    launcher: Launcher, scenario: Scenario, planned: Sequence[Endpoint]
) -> None:
    """A fresh simulator per provider of the scenario, on its planned port."""
    for p, e in zip(scenario.providers, planned, strict=True):
        args = (*ENGINE, "--tool-rounds", TOOL_ROUNDS, *sim_flags(scenario, p))
        await launcher.engine(p.id, *args, port=_port(e))


def _port(endpoint: Endpoint) -> int:
    return int(endpoint.url.rsplit(":", 1)[1])


async def start_arm(
    arm: str,
    launcher: Launcher,
    scenario: Scenario,
    planned: Sequence[Endpoint],
    *,
    stated: bool = False,
) -> tuple[list[str], dict[str, Any]]:
    """The providers and what `arm` puts in front of them: the base URLs (with /v1) agents
    talk to, and the front's configuration as written (for the results)."""
    bases = [e.url + "/v1" for e in planned]
    if arm in ("direct", "direct-patient"):
        await start_providers(launcher, scenario, planned)
        return bases, {}
    if arm == "litellm":
        config = litellm_config(scenario, bases, SIM_MODEL)
        url = await _litellm(launcher, config, avoid={_port(e) for e in planned})
        await start_providers(launcher, scenario, planned)
        return [url], config
    if arm in ("luftpause", "luftpause-limits"):
        await start_providers(launcher, scenario, planned)
        entries = luftpause_endpoints(scenario, planned, arm, stated)
        url = await _luftpause(launcher, entries)
        return [url], {"endpoints": [e.entry() for e in entries]}
    raise ValueError(f"unknown arm {arm!r}")


async def _litellm(launcher: Launcher, config: dict[str, Any], avoid: set[int]) -> str:
    """The LiteLLM proxy on `config`, on a free port other than the providers' (`avoid`:
    planned, not yet taken)."""
    path = launcher.workdir / "litellm.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    while port in avoid:
        port = free_port()
    exe = str(Path(sys.executable).with_name("litellm"))
    proc = Proc(
        ["--config", str(path), "--host", "127.0.0.1", "--port", str(port)],
        name="litellm",
        program=[exe],
        log_path=launcher.workdir / "litellm.log",
        env=LITELLM_ENV,
    )
    await proc.start()
    launcher.exits.push_async_callback(proc.stop)
    # Its start is not measured; on a loaded machine it has taken over two minutes.
    await proc.wait_http(local_url(port) + "/health/liveliness", timeout=300)
    return local_url(port) + "/v1"


def luftpause_endpoints(
    scenario: Scenario, planned: Sequence[Endpoint], arm: str, stated: bool = False
) -> list[Endpoint]:
    """The endpoint file's entries of a luftpause arm: as a new user gives them (no `limits`),
    rate-limited from the start (`limits: {}`), or with `stated` the limits per window."""
    if arm == "luftpause":
        return [Endpoint(id=e.id, url=e.url, models=e.models) for e in planned]
    if arm != "luftpause-limits":
        raise ValueError(f"{arm!r} is no luftpause arm")
    return [
        Endpoint(
            id=e.id,
            url=e.url,
            models=e.models,
            options={
                "limits": stated_limits(p, scenario.window_real_s, scenario.charge)
                if stated
                else {}
            },
        )
        for p, e in zip(scenario.providers, planned, strict=True)
    ]


async def _luftpause(launcher: Launcher, entries: Sequence[Endpoint]) -> str:
    config = write_endpoints(launcher.workdir / "endpoints.yaml", entries)
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


def align_wait_s(window_real_s: float, reset_s: float, phase_s: float) -> float:
    """Real seconds to wait from now, `reset_s` before a fixed window ends, until `phase_s`
    into a window: this one's if that is still ahead, else the next one's."""
    elapsed = max(0.0, window_real_s - reset_s)
    return phase_s - elapsed if elapsed <= phase_s else reset_s + phase_s


def align_phase_s(scenario: Scenario) -> float:
    """How far into a fixed window a measurement starts (0 for a bucket)."""
    if scenario.regime != "fixed":
        return 0.0
    return min(ALIGN_PHASE_S, scenario.window_real_s / 2)


async def align(session: aiohttp.ClientSession, scenario: Scenario, urls: Sequence[str]) -> float:
    """Wait until `align_phase_s` into a window (fixed regime; a bucket needs no wait), then
    zero every simulator's tally and make its budgets whole, so an arm starts as every other
    did; the seconds waited."""
    waited = 0.0
    if scenario.regime == "fixed":
        body = await limits_of(session, urls[0])
        reset = max(b["reset_s"] for b in body["budgets"].values())
        waited = align_wait_s(scenario.window_real_s, reset, align_phase_s(scenario))
        await asyncio.sleep(waited)
    await asyncio.gather(*(_reset(session, u) for u in urls))
    return waited


async def _reset(session: aiohttp.ClientSession, url: str) -> None:
    async with session.post(url + "/debug/reset") as resp:
        resp.raise_for_status()


def counts(body: dict[str, Any]) -> dict[str, int]:
    """The tally in a `/debug/limits` body: served, refused, billed and refused tokens."""
    tally = body["counts"]
    return {
        k: int(tally.get(k, 0)) for k in ("served", "refused", "billed_tokens", "refused_tokens")
    }
