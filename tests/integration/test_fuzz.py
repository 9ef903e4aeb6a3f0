"""Fuzzing a running dataplane: whatever arrives, it answers 2xx or a 4xx JSON error in time.

The stack is real (simulated engines, scheduler, dataplane as child processes, started once for
the module); Hypothesis generates bodies (any JSON value, any bytes, chat and decide bodies with
fields of the wrong type) and identity headers (class, caller, run id with any text, long ones
included), sent with aiohttp.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from luftpause.testkit.stack import SIM_MODEL, LocalStack

pytestmark = pytest.mark.asyncio(loop_scope="module")

REQUEST_SECONDS = 10.0
TURN_PATHS = ("/v1/chat/completions", "/v1/decide")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fuzz_stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalStack]:
    workdir: Path = tmp_path_factory.mktemp("fuzz")
    async with AsyncExitStack() as exits:
        local = await LocalStack(workdir, engine_args=("--time-scale", "50")).start(exits)
        await local.wait_healthy()
        yield local


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def http(fuzz_stack: LocalStack) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
messages = st.just([{"role": "user", "content": "hi"}])
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
tools = st.lists(st.just(TOOL), max_size=2)
chat_fields = {
    "model": st.just(SIM_MODEL),
    "messages": messages,
    "stream": st.booleans(),
    "max_tokens": st.integers(min_value=1, max_value=8),
    "tools": tools,
    "tool_choice": json_values,
    "temperature": json_values,
    "n": json_values,
    "stream_options": json_values,
    "logprobs": json_values,
    "top_logprobs": json_values,
}
LABELS = ("urgent", "lookup", "chitchat", "Billing", "on hold", "C++")
decide_fields = {
    "model": st.sampled_from([SIM_MODEL, "unknown-classifier"]),
    "input": st.one_of(
        st.sampled_from(["the pager rings", "how many people live in Oslo?"]),
        st.text(min_size=1, max_size=50),
        st.lists(st.text(max_size=10), max_size=3),
    ),
    "labels": st.lists(st.sampled_from(LABELS), min_size=2, max_size=6, unique=True)
    | st.lists(st.text(max_size=12), max_size=22),
}


@st.composite
def near_valid(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]]) -> bytes:
    """A body with each field present or not, of its type or (one in six) of any JSON type."""
    doc: dict[str, Any] = {}
    for name, good in fields.items():
        if draw(st.booleans()) or name in ("model", "messages", "input"):
            wrong = draw(st.integers(0, 5)) == 0
            doc[name] = draw(json_values if wrong else good)
    return json.dumps(doc).encode()


other_bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=512),
)
bodies_for = {
    "/v1/chat/completions": st.one_of(near_valid(chat_fields), near_valid(chat_fields)),
    "/v1/decide": st.one_of(near_valid(decide_fields), near_valid(decide_fields)),
}


# Header text as an HTTP client can send it: no control characters (aiohttp refuses them),
# and within aiohttp's 8190-byte header limit (past it the HTTP parser answers a plain 400).
header_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=400
)
headers = st.fixed_dictionaries(
    {},
    optional={
        "x-luftpause-class": st.one_of(
            st.sampled_from(["interactive", "batch", " Batch "]), st.just("batch"), header_text
        ),
        "x-luftpause-caller": header_text,
        "x-luftpause-run-id": st.one_of(
            st.text(alphabet="abcdef0123456789-", min_size=1, max_size=32),
            st.text(alphabet="abcdef0123456789-", min_size=1, max_size=32),
            header_text,
        ),
        "Content-Type": st.sampled_from(["application/json", "text/plain", "x/y"]),
    },
)


async def _exchange(
    http: aiohttp.ClientSession,
    url: str,
    method: str,
    body: bytes | io.BytesIO,
    sent: dict[str, str],
) -> tuple[int, dict[str, str], bytes]:
    async with (
        asyncio.timeout(REQUEST_SECONDS),
        http.request(method, url, data=body, headers=sent) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.read()


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, bytes]:
    """Mostly POSTs to the turn routes with their own kind of body, near valid."""
    path = draw(st.sampled_from([*TURN_PATHS, *TURN_PATHS, *TURN_PATHS, "/v1/models", "/x"]))
    method = draw(st.sampled_from(["POST"] * 6 + ["GET", "PUT"]))
    own = bodies_for.get(path, other_bodies)
    body = draw(st.one_of(own, own, own, other_bodies))
    return path, method, body


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(request=requests(), sent=headers)
async def test_every_answer_is_2xx_or_a_4xx_json_error_in_time(
    fuzz_stack: LocalStack,
    http: aiohttp.ClientSession,
    request: tuple[str, str, bytes],
    sent: dict[str, str],
) -> None:
    """Invariant: no 5xx (the engines are healthy), a 4xx body is `{"error": {"message"}}`,
    a turn route's answer carries `x-luftpause-run-id`, and every answer comes within 10 s."""
    path, method, body = request
    url = fuzz_stack.base_url.removesuffix("/v1") + path
    status, got, data = await _exchange(http, url, method, body, sent)
    event(f"{method} {path} -> {status}")
    assert status < 500, (status, data[:300])
    if status >= 400:
        error = json.loads(data)["error"]
        assert isinstance(error["message"], str) and error["message"]
    if path in TURN_PATHS and method == "POST" and status != 401:
        assert got.get("x-luftpause-run-id"), (status, data[:300])


async def test_a_body_over_the_limit_is_413_and_the_dataplane_still_answers(
    fuzz_stack: LocalStack, http: aiohttp.ClientSession
) -> None:
    url = fuzz_stack.base_url + "/chat/completions"
    big = io.BytesIO(b'{"model": "x", "pad": "' + b"x" * (17 * 1024 * 1024) + b'"}')
    status, _, data = await _exchange(http, url, "POST", big, {"Content-Type": "application/json"})
    assert status == 413 and "limit" in json.loads(data)["error"]["message"], data


async def test_health_still_answers_after_the_fuzzing(
    fuzz_stack: LocalStack, http: aiohttp.ClientSession
) -> None:
    url = fuzz_stack.base_url.removesuffix("/v1") + "/health"
    status, _, data = await _exchange(http, url, "GET", b"", {})
    assert status == 200 and json.loads(data) == {"status": "ok"}
    assert all(proc.running for proc in fuzz_stack.procs.values())


async def test_simulator_answers_malformed_tools_with_a_4xx(
    fuzz_stack: LocalStack, http: aiohttp.ClientSession
) -> None:
    url = fuzz_stack.engine_url(0) + "/v1/chat/completions"
    malformed: object
    for malformed in ({}, [None], [{}], "x"):
        body: dict[str, object] = {
            "model": SIM_MODEL,
            "messages": [{"role": "user", "content": "hi"}],
        }
        body["tools"] = malformed
        status, _, _ = await _exchange(http, url, "POST", json.dumps(body).encode(), {})
        assert 400 <= status < 500, malformed
