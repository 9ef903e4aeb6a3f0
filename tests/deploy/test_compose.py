"""deploy/compose.yaml on real containers, from images built from this checkout.

The Docker engine is the session's (`conftest.docker_daemon`: started here when none answers).
The images are built by `make images` on `luftpause-base:local` (Debian's python3, built by
deploy/docker/base/build-base.sh when missing) with the host's CA certificates. The stack runs
under a project name of its own, its ports published on free loopback ports and a token set,
and is taken down with its network and journal volume afterwards, failed or not.

What the official clients see through the containers: the `openai` client streams a turn
through the dataplane; a tool-calling run keeps its engine for every turn; the `mcp` client
spawns and awaits a sub-agent through the runtime. What survives: six own-loop agents see no
error while the scheduler container is killed and started again; sub-agent runs go on from the
journal on the volume after the runtime container is killed mid-run, and each finishes once.
And an overlay that writes its endpoint file when the container starts (compose.hosted.yaml,
a simulated engine standing in for the hosted API and requiring its key) runs as written.

Image build times and sizes and the stack's time are printed at the end; with
LUFTPAUSE_DEPLOY_REPORT=<file> they are also written there as JSON
(`python -m tests.deploy.measure_images` uses it for bench/results/images.json).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from openai import AsyncOpenAI

from luftpause.testkit.agents import AgentStats, run_task
from luftpause.testkit.procs import free_port
from luftpause.testkit.stack import SIM_MODEL
from tests.deploy import containers as c
from tests.deploy.containers import Daemon

# Builds take minutes when the layer cache is cold; every wait below has its own bound.
pytestmark = [pytest.mark.timeout(2400), pytest.mark.asyncio(loop_scope="module")]

COMPOSE_FILE = c.ROOT / "deploy" / "compose.yaml"
ENGINES = {"engine-a", "engine-b"}
TOOL_ROUNDS = 3  # the simulator's default: three tool calls, then the answer
STACK_UP_TIMEOUT = 180.0
RESTART_TIMEOUT = 90.0
AGENTS = 6


@dataclass
class Stack:
    """The running stack: its project, host URLs and token, and Compose commands on it."""

    daemon: Daemon
    project: str
    token: str
    env: dict[str, str]
    files: tuple[Path, ...]
    dataplane: str
    runtime: str
    status: str

    def compose(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        files = [arg for path in self.files for arg in ("-f", str(path))]
        command = [*c.compose_cli(), "-p", self.project, *files, *args]
        return c.run(command, timeout=timeout, env=self.env, check=check).stdout

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).strip()

    def docker(self, *args: str, timeout: float = 60) -> str:
        return c.run([self.daemon.docker, *args], timeout=timeout).stdout

    def journal(self) -> list[dict[str, Any]]:
        text = self.compose("exec", "-T", "runtime", "cat", "/var/lib/luftpause/runs.jsonl")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def logs(self, service: str) -> list[dict[str, Any]]:
        """The service's JSON log lines (the services log JSON when stderr is not a terminal)."""
        done = c.run([self.daemon.docker, "logs", self.container(service)], timeout=60)
        lines = (done.stdout + done.stderr).splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def runtime_status(self) -> dict[str, Any]:
        return get_json(self.runtime + "/status", self.token)


def get_status(url: str, token: str = "") -> int:
    """The HTTP status `url` answers with (0: nothing answers yet)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            status: int = resp.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0


def get_json(url: str, token: str = "") -> dict[str, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        body: dict[str, Any] = json.load(resp)
        return body


def wait_until(what: str, check: Any, timeout: float) -> None:
    """Poll `check()` every 0.2 s until it is true; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


def stack_ready(stack: Stack) -> bool:
    if get_status(stack.dataplane + "/ready") != 200 or get_status(stack.runtime + "/ready") != 200:
        return False
    try:
        replicas = get_json(stack.status + "/status")["replicas"]
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
    return {r["id"] for r in replicas if r["healthy"]} == ENGINES


def kill_and_start(stack: Stack, service: str, ready_url: str) -> float:
    """`docker kill` the service's container, `docker start` it, wait until `ready_url` answers
    200; the seconds from the kill to ready. The container is the same, so are its volumes.
    """
    container = stack.container(service)
    before = c.started_at(stack.daemon.docker, container)
    killed = time.monotonic()
    stack.docker("kill", container)
    # Stopped, or already started again by its restart policy.
    wait_until(
        f"the killed {service} container down",
        lambda: c.started_at(stack.daemon.docker, container) != before,
        30,
    )
    stack.docker("start", container)
    wait_until(f"{service} ready again", lambda: get_status(ready_url) == 200, RESTART_TIMEOUT)
    return round(time.monotonic() - killed, 1)


@pytest.fixture(scope="module")
def report(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """Build times, sizes and the stack's time: printed at the end, and written to
    LUFTPAUSE_DEPLOY_REPORT when it is set.
    """
    numbers: dict[str, Any] = {}
    yield numbers
    lines = [
        f"image luftpause/{name}: {numbers['image_bytes'][name] / 1e6:.0f} MB, built in {s} s"
        for name, s in numbers.get("build_seconds", {}).items()
        if name in numbers.get("image_bytes", {})
    ]
    lines += [f"{key}: {value}" for key, value in numbers.items() if not isinstance(value, dict)]
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            for line in lines:
                reporter.write_line(line)
    target = os.environ.get("LUFTPAUSE_DEPLOY_REPORT")
    if target:
        Path(target).write_text(json.dumps(numbers, indent=2) + "\n")


@pytest.fixture(scope="module")
def images(docker_daemon: Daemon, report: dict[str, Any]) -> None:
    """The stack's images, built from this checkout on the local Debian base image."""
    report["base_build_seconds"] = round(c.build_base(docker_daemon.docker), 1)
    report["build_seconds"] = c.build_images(
        docker_daemon.docker, c.STACK_IMAGES, base_image=c.LOCAL_BASE, ca_certs=c.HOST_CA_DIR
    )
    report["image_bytes"] = {
        name: c.image_size(docker_daemon.docker, f"luftpause/{name}:{c.VERSION}")
        for name in c.STACK_IMAGES
    }


@contextmanager
def compose_stack(
    daemon: Daemon,
    files: tuple[Path, ...],
    logs: Path,
    services: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """`compose up -d` under a project name of its own, with a token and free loopback ports;
    `down -v` afterwards, failed or not, once the services' logs are saved to `logs`.
    """
    ports = {name: free_port() for name in ("dataplane", "runtime", "status")}
    project = f"luftpause-test-{secrets.token_hex(4)}"
    token = secrets.token_hex(16)
    st = Stack(
        daemon=daemon,
        project=project,
        token=token,
        env={
            "COMPOSE_PROJECT_NAME": project,
            "LUFTPAUSE_VERSION": c.VERSION,
            "LUFTPAUSE_TOKEN": token,
            "LUFTPAUSE_PUBLISH_ADDR": "127.0.0.1",
            "LUFTPAUSE_PUBLISH_DATAPLANE": str(ports["dataplane"]),
            "LUFTPAUSE_PUBLISH_RUNTIME": str(ports["runtime"]),
            "LUFTPAUSE_PUBLISH_STATUS": str(ports["status"]),
            **(env or {}),
        },
        files=files,
        dataplane=f"http://127.0.0.1:{ports['dataplane']}",
        runtime=f"http://127.0.0.1:{ports['runtime']}",
        status=f"http://127.0.0.1:{ports['status']}",
    )
    try:
        st.compose("up", "-d", *services, timeout=STACK_UP_TIMEOUT)
        yield st
    finally:
        logs.write_text(st.compose("logs", "--no-color", check=False, timeout=60))
        st.compose("down", "-v", "--remove-orphans", "-t", "5", check=False, timeout=180)
    left = c.leftovers(daemon.docker, project)
    assert not left, f"compose down left {left}"


@pytest.fixture(scope="module")
def stack(
    docker_daemon: Daemon,
    images: None,
    report: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """deploy/compose.yaml up, every service ready (logs kept in a temporary directory)."""
    logs = tmp_path_factory.mktemp("compose") / "logs.txt"
    report["logs"] = str(logs)
    started = time.monotonic()
    try:
        with compose_stack(docker_daemon, (COMPOSE_FILE,), logs) as st:
            wait_until("every service ready", lambda: stack_ready(st), STACK_UP_TIMEOUT)
            report["stack_up_seconds"] = round(time.monotonic() - started, 1)
            yield st
    finally:
        report["stack_seconds"] = round(time.monotonic() - started, 1)


async def test_the_openai_client_streams_a_chat_turn_through_the_dataplane_container(
    stack: Stack,
) -> None:
    client = AsyncOpenAI(base_url=stack.dataplane + "/v1", api_key=stack.token, max_retries=0)
    stranger = AsyncOpenAI(base_url=stack.dataplane + "/v1", api_key="nope", max_retries=0)
    async with client, stranger, asyncio.timeout(30):
        stream = await client.chat.completions.create(
            model=SIM_MODEL,
            messages=[{"role": "user", "content": "hello from a container test"}],
            stream=True,
            max_tokens=16,
        )
        chunks = [chunk async for chunk in stream]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert len(chunks) > 2 and text.strip()
        assert {ch.system_fingerprint for ch in chunks if ch.system_fingerprint} <= ENGINES
        with pytest.raises(openai.AuthenticationError):
            await stranger.models.list()


async def test_a_tool_calling_run_keeps_its_engine_container_for_every_turn(stack: Stack) -> None:
    client = AsyncOpenAI(base_url=stack.dataplane + "/v1", api_key=stack.token, max_retries=0)
    stats = AgentStats()
    async with client, asyncio.timeout(60):
        record = await run_task(
            client,
            stats,
            run_id=f"affinity-{secrets.token_hex(4)}",
            model=SIM_MODEL,
            task="How long is the Danube?",
            headers={"x-luftpause-caller": "container-test"},
        )
    assert not stats.errors and record.completed
    assert record.turns == TOOL_ROUNDS + 1
    assert len(record.replicas) == 1 and record.replicas <= ENGINES, record.replicas


def mcp_client(stack: Stack) -> tuple[httpx2.AsyncClient, Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {stack.token}"}, timeout=60)
    return http, Client(streamable_http_client(stack.runtime + "/mcp", http_client=http))


async def call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def test_the_mcp_client_spawns_and_awaits_a_sub_agent_through_the_runtime_container(
    stack: Stack,
) -> None:
    http, client = mcp_client(stack)
    async with http, asyncio.timeout(60), client:
        spawned = await call(client, "spawn", {"task": "the Rhine", "tools": ["lookup"]})
        out = await call(client, "await", {"handles": [spawned["handle"]], "timeout": 45})
    [run] = out["runs"]
    assert run["state"] == "finished" and run["result"], run
    assert run["toolCalls"] == TOOL_ROUNDS and run["failedToolCalls"] == 0


async def test_agents_see_no_error_while_the_scheduler_container_is_killed_and_started(
    stack: Stack, report: dict[str, Any]
) -> None:
    client = AsyncOpenAI(base_url=stack.dataplane + "/v1", api_key=stack.token, max_retries=0)
    stats = AgentStats()
    stop = asyncio.Event()

    async def agent(i: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            await run_task(
                client,
                stats,
                run_id=f"restart-{stack.project}-{i}-{n}",
                model=SIM_MODEL,
                task=f"agent {i} task {n}",
                headers={"x-luftpause-caller": f"agent{i % 3}"},
                max_retries=0,
            )

    def completed() -> int:
        return sum(r.completed for r in stats.runs)

    async with client, asyncio.timeout(240), asyncio.TaskGroup() as agents:
        for i in range(AGENTS):
            agents.create_task(agent(i))
        while completed() < AGENTS:
            await asyncio.sleep(0.1)
        in_flight_at_kill = sum(not r.ended for r in stats.runs)
        report["scheduler_restart_seconds"] = await asyncio.to_thread(
            kill_and_start, stack, "scheduler", stack.status + "/ready"
        )
        # Every agent finishes a run it started after the scheduler came back.
        back = len(stats.runs)
        while sum(r.completed for r in stats.runs[back:]) < AGENTS:
            await asyncio.sleep(0.1)
        stop.set()
    assert in_flight_at_kill > 0
    assert not stats.errors, stats.errors
    assert all(r.completed for r in stats.runs)
    moved = [r.run_id for r in stats.runs if len(r.replicas) != 1]
    assert not moved, f"runs that changed engine: {moved}"


async def test_sub_agents_resume_from_the_journal_volume_after_the_runtime_container_is_killed(
    stack: Stack, report: dict[str, Any]
) -> None:
    http, client = mcp_client(stack)
    async with http, asyncio.timeout(60), client:
        handles = [
            (await call(client, "spawn", {"task": f"river {i}", "tools": ["lookup"]}))["handle"]
            for i in range(4)
        ]

    def mid_run() -> bool:
        """A run has journaled a tool round and has another to go (a second or more)."""
        nodes = [n for n in stack.runtime_status()["tree"] if n["handle"] in handles]
        return any(1 <= n["own"]["toolCalls"] < TOOL_ROUNDS for n in nodes)

    await asyncio.to_thread(wait_until, "a run past its first tool call", mid_run, 30)
    report["runtime_restart_seconds"] = await asyncio.to_thread(
        kill_and_start, stack, "runtime", stack.runtime + "/ready"
    )

    http, client = mcp_client(stack)
    async with http, asyncio.timeout(90), client:
        out = await call(client, "await", {"handles": handles, "timeout": 60})
    runs = out["runs"]
    assert all(r["state"] == "finished" for r in runs), runs
    assert all(r["toolCalls"] == TOOL_ROUNDS for r in runs), runs

    replayed = [e for e in stack.logs("runtime") if e.get("event") == "runtime.replayed"]
    assert replayed and replayed[-1]["resumed"] > 0, replayed  # the kill landed mid-run
    records = [r for r in stack.journal() if r.get("run") in handles]
    finished = Counter(r["run"] for r in records if r["type"] == "finished")
    assert finished == Counter({h: 1 for h in handles})
    rounds = [(r["run"], r["round"]) for r in records if r["type"] == "round"]
    assert len(rounds) == len(set(rounds)) == len(handles) * TOOL_ROUNDS


async def test_the_hosted_overlay_writes_its_endpoint_file_and_sends_the_key(
    docker_daemon: Daemon, images: None, tmp_path: Path
) -> None:
    """compose.hosted.yaml with fake-engine-a standing in for the hosted API, requiring a key:
    the scheduler's probes and the dataplane's turns reach it with that key.
    """
    await asyncio.to_thread(hosted_overlay_turn, docker_daemon, tmp_path)


def hosted_overlay_turn(docker_daemon: Daemon, tmp_path: Path) -> None:
    key = secrets.token_hex(8)
    requires_key = tmp_path / "requires-key.yaml"
    engine = {"environment": {"LUFTPAUSE_REQUIRE_KEY": "${HOSTED_API_KEY}"}}
    requires_key.write_text(json.dumps({"services": {"fake-engine-a": engine}}))
    files = (COMPOSE_FILE, COMPOSE_FILE.with_name("compose.hosted.yaml"), requires_key)
    env = {
        "HOSTED_URL": "http://fake-engine-a:9001",
        "HOSTED_MODEL": SIM_MODEL,
        "HOSTED_API_KEY": key,
    }
    services = ("scheduler", "dataplane", "fake-engine-a")
    with compose_stack(docker_daemon, files, tmp_path / "logs.txt", services, env) as st:

        def hosted_healthy() -> bool:
            try:
                replicas = get_json(st.status + "/status")["replicas"]
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False
            return [(r["id"], r["healthy"]) for r in replicas] == [("hosted", True)]

        wait_until("the hosted replica probed healthy", hosted_healthy, STACK_UP_TIMEOUT)
        wait_until(
            "the dataplane ready",
            lambda: get_status(st.dataplane + "/ready") == 200,
            STACK_UP_TIMEOUT,
        )
        with openai.OpenAI(
            base_url=st.dataplane + "/v1", api_key=st.token, max_retries=0, timeout=30
        ) as client:
            reply = client.chat.completions.create(
                model=SIM_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        assert reply.system_fingerprint == "engine-a" and reply.choices[0].message.content
