"""The own-loop examples (examples/) as their users run them, against a local stack this module
owns: two simulated engines, the scheduler and the dataplane on free loopback ports.

Each example runs as a script. Between it and the dataplane sits a recording proxy that keeps
every request's headers and the `system_fingerprint` of the reply (the replica that answered),
so the checks see what the library really sent and who really answered: one run id, class and
caller on every turn, several turns, all of them on one replica, and the run ended with
DELETE /v1/runs/{id}.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from luftpause.testkit.procs import free_port
from luftpause.testkit.stack import LocalStack

pytestmark = pytest.mark.asyncio(loop_scope="module")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOOL_ROUNDS = 2  # the simulated model calls lookup this many times, then answers
ENGINE_ARGS = ("--time-scale", "20", "--tool-rounds", str(TOOL_ROUNDS))
RUN_ID, CLASS, CALLER = "x-luftpause-run-id", "x-luftpause-class", "x-luftpause-caller"
# Hop-by-hop and framing headers: the proxy's own connection sets them.
_NOT_PASSED = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}
)


@dataclass(frozen=True)
class Seen:
    """One request through the proxy: its request headers (lower-case names) and the reply."""

    method: str
    path: str
    headers: dict[str, str]
    status: int
    fingerprint: str | None


def fingerprint_of(body: bytes) -> str | None:
    """The `system_fingerprint` of a JSON reply or of the first SSE chunk that has one."""
    try:
        docs = [json.loads(body)]
    except ValueError:
        lines = body.decode(errors="replace").splitlines()
        docs = [
            json.loads(line[5:])
            for line in lines
            if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]")
        ]
    return next((d["system_fingerprint"] for d in docs if d.get("system_fingerprint")), None)


@dataclass
class Recorder:
    """A pass-through HTTP proxy to `upstream` that keeps a `Seen` per request."""

    upstream: str
    seen: list[Seen] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_PASSED}
        async with (
            aiohttp.ClientSession() as s,
            s.request(
                request.method,
                self.upstream + request.path_qs,
                data=await request.read(),
                headers=headers,
            ) as resp,
        ):
            body = await resp.read()
            back = {k: v for k, v in resp.headers.items() if k.lower() not in _NOT_PASSED}
            status = resp.status
        self.seen.append(
            Seen(
                method=request.method,
                path=request.path,
                headers={k.lower(): v for k, v in request.headers.items()},
                status=status,
                fingerprint=fingerprint_of(body),
            )
        )
        return web.Response(status=status, body=body, headers=back)


@dataclass
class Site:
    stack: LocalStack
    recorder: Recorder
    base_url: str  # the proxy's OpenAI base URL


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def site(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Site]:
    workdir = tmp_path_factory.mktemp("examples")
    async with AsyncExitStack() as exits:
        stack = await LocalStack(workdir, engine_args=ENGINE_ARGS).start(exits)
        await stack.wait_healthy()
        recorder = Recorder(upstream=f"http://127.0.0.1:{stack.dataplane_port}")
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", recorder.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        exits.push_async_callback(runner.cleanup)
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield Site(stack=stack, recorder=recorder, base_url=f"http://127.0.0.1:{port}/v1")


async def run_example(script: str, *args: str, timeout: float = 60.0) -> str:
    """Run examples/<script>.py with `args`; its stdout, or a failure with its stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / f"{script}.py"),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    return out.decode()


@pytest.mark.parametrize(
    ("script", "service_class"),
    [("openai_loop", "interactive"), ("agents_sdk", "batch"), ("langgraph_agent", "interactive")],
)
async def test_an_example_run_sends_its_headers_on_every_turn_and_stays_on_one_replica(
    site: Site, script: str, service_class: str
) -> None:
    run_id, caller = f"{script}-{uuid.uuid4().hex[:8]}", f"tests-{script}"
    out = await run_example(
        script,
        *("--base-url", site.base_url, "--run-id", run_id),
        *("--class", service_class, "--caller", caller),
        "How long is the Loire?",
    )
    assert out.startswith(f"{run_id}: ") and len(out.strip()) > len(run_id) + 2, out
    turns = [
        s
        for s in site.recorder.seen
        if s.path == "/v1/chat/completions" and s.headers.get(RUN_ID) == run_id
    ]
    assert len(turns) == TOOL_ROUNDS + 1, turns  # a turn per lookup, then the answer
    assert {(t.headers.get(CLASS), t.headers.get(CALLER)) for t in turns} == {
        (service_class, caller)
    }
    assert all(t.status == 200 for t in turns), turns
    replicas = {t.fingerprint for t in turns}
    assert len(replicas) == 1 and replicas <= {"engine-0", "engine-1"}, turns
    ended = [s.status for s in site.recorder.seen if s.method == "DELETE" and run_id in s.path]
    assert ended == [200]
