"""Failure semantics of a turn through the dataplane, one row of the README's table per test.

Real processes on loopback: simulated engines, one scheduler, one dataplane; clients are the
official openai package or aiohttp (where the raw bytes matter). One engine, `a-victim`, runs
in this process, so a test can see the scheduler's health probe arrive and close the port just
after it. Each model is served by its own engines, so a test that kills or fills one leaves
the others alone:

    luftpause-sim  e0, e1      plain turns, client disconnects, injected 503 and cuts
    capped         capped      --max-running 1, slow: a queue, so the scheduler caps it
    hosted         hosted      --rpm 1: the hosted API's 429
    doomed         doomed      killed with SIGKILL mid-stream
    flaky          a-victim    in-process; its port is closed mid-test
                   e1          the healthy replica beside it
    silent         a-silent    in-process; its port is taken by a socket that never accepts

After every failure the scheduler must show the slot freed and the run idle, never paused on a
tool (`settled`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio

from luftpause.testkit.engine import wire
from luftpause.testkit.stack import SIM_MODEL
from luftpause.testkit.waits import WAIT_SECONDS, eventually
from tests.integration.failure_stack import (
    CAPPED,
    DOOMED,
    FLAKY,
    HELLO,
    HOSTED,
    RUN,
    SILENT,
    TOOLS,
    Stack,
    black_hole,
    failure_stack,
    sse_until_broken,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async with failure_stack(tmp_path_factory.mktemp("failures")) as s:
        yield s


# --- client disconnects ---------------------------------------------------------------------


async def test_a_client_that_leaves_while_held_drops_its_turn_and_no_engine_request_is_made(
    stack: Stack,
) -> None:
    body = {"model": CAPPED, "stream": True, "messages": HELLO}
    direct = f"http://127.0.0.1:{stack.ports['capped']}/v1/chat/completions"
    abandoned = await stack.dataplane_turns("abandoned")
    async with AsyncExitStack() as exits, asyncio.timeout(2 * WAIT_SECONDS):
        # One turn running through the dataplane, one queued behind it sent straight to the
        # engine: the engine reports a queue, so the scheduler caps it at what it runs.
        running = await exits.enter_async_context(
            stack.session.post(stack.chat_url, json=body, headers={RUN: "cap-running"})
        )
        await running.content.readany()
        queued = await exits.enter_async_context(stack.session.post(direct, json=body))
        assert queued.status == 200
        await stack.until(
            lambda s: any(r["id"] == "capped" and r["capacity"] == 1 for r in s["replicas"]),
            "the scheduler to cap `capped` at the one turn it runs",
        )
        engine_requests = (await stack.engine_metrics("capped"))["luftpause_sim_requests_total"]
        assert engine_requests == 2

        async with aiohttp.ClientSession() as leaver:

            async def held_turn() -> None:
                async with leaver.post(stack.chat_url, json=body, headers={RUN: "cap-held"}):
                    raise AssertionError("a held turn was answered")

            task = asyncio.create_task(held_turn())
            st = await stack.until(lambda s: s["held_total"] == 1, "the third turn held")
            assert st["held"][0]["class"] == "interactive"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await stack.until(lambda s: s["held_total"] == 0, "the held turn dropped")
        assert await stack.dataplane_turns("abandoned") == abandoned + 1
        m = await stack.engine_metrics("capped")
        assert m["luftpause_sim_requests_total"] == engine_requests  # it never reached the engine
    await stack.settled()


async def test_a_client_that_leaves_mid_stream_stops_generation_and_may_retry_its_run(
    stack: Stack,
) -> None:
    failed = await stack.dataplane_turns("failed")
    async with asyncio.timeout(2 * WAIT_SECONDS), stack.client(**{RUN: "mid-stream"}) as c:
        stream = await c.chat.completions.create(model=SIM_MODEL, messages=HELLO, stream=True)
        got = []
        async for chunk in stream:
            got.append(chunk)
            if len(got) == 3:
                break
        replica = got[0].system_fingerprint or ""
        before = await stack.engine_metrics(replica)
        await stream.close()

        m = await eventually(
            lambda: stack.engine_metrics(replica),
            lambda m: m["luftpause_sim_aborted_total"] == before["luftpause_sim_aborted_total"] + 1,
            f"{replica} to count the left stream as aborted",
        )
        assert m["sglang:num_running_reqs"] == 0
        assert m["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 1000
        st = await stack.settled()
        assert st["runs"]["idle"]["interactive"] >= 1
        assert await stack.dataplane_turns("failed") == failed + 1

        retry = await c.chat.completions.create(model=SIM_MODEL, messages=HELLO, max_tokens=8)
    assert retry.choices[0].finish_reason == "length"
    assert retry.system_fingerprint == replica  # the idle run went back to its replica
    await stack.settled()


# --- engine refuses or breaks ---------------------------------------------------------------


async def test_a_refused_connection_is_a_502_at_once_until_the_probe_takes_the_replica_out(
    stack: Stack,
) -> None:
    failed = await stack.dataplane_turns("failed")
    async with asyncio.timeout(2 * WAIT_SECONDS):
        # Close the victim's port just after a probe, so the next probe is a period away.
        stack.victim.probed.clear()
        await stack.victim.probed.wait()
        await stack.victim.stop()
        async with stack.session.post(
            stack.chat_url, json={"model": FLAKY, "messages": HELLO}, headers={RUN: "flaky"}
        ) as resp:
            payload = await resp.json()
            assert resp.status == 502
            assert resp.headers[RUN] == "flaky"
        assert list(payload) == ["error"] and list(payload["error"]) == ["message"]
        message = payload["error"]["message"]
        # At once: the refusal itself, not a connect timeout waited out, and before the probe.
        assert message.startswith("engine a-victim: ") and "timeout" not in message.lower()
        st = await stack.settled()
        assert any(r["id"] == "a-victim" and r["healthy"] for r in st["replicas"])  # not yet out
        assert await stack.dataplane_turns("failed") == failed + 1

        await stack.until(
            lambda s: any(r["id"] == "a-victim" and not r["healthy"] for r in s["replicas"]),
            "the probe to take a-victim out",
        )
        async with stack.client(**{RUN: "flaky"}) as c:
            replies = [
                await c.chat.completions.create(model=FLAKY, messages=HELLO, max_tokens=4)
                for _ in range(3)
            ]
    assert {r.system_fingerprint for r in replies} == {"e1"}
    await stack.settled()


async def test_an_engine_host_that_does_not_answer_is_a_502_after_the_connect_timeout(
    stack: Stack,
) -> None:
    failed = await stack.dataplane_turns("failed")
    async with asyncio.timeout(2 * WAIT_SECONDS):
        stack.silent.probed.clear()
        await stack.silent.probed.wait()
        await stack.silent.stop()
        async with black_hole(stack.ports["a-silent"]):
            body = {"model": SILENT, "messages": HELLO}
            try:  # well short of the OS's own connect timeout, about two minutes
                async with (
                    asyncio.timeout(WAIT_SECONDS),
                    stack.session.post(stack.chat_url, json=body, headers={RUN: "silent"}) as resp,
                ):
                    payload = await resp.json()
                    assert resp.status == 502
                    assert resp.headers[RUN] == "silent"
            except TimeoutError as exc:
                raise AssertionError(
                    f"no answer in {WAIT_SECONDS:g} s: the dataplane's own 2 s connect timeout "
                    "did not end the turn"
                ) from exc
            message = payload["error"]["message"]
            assert message.startswith("engine a-silent: ") and "timeout" in message.lower()
            await stack.settled()
    assert await stack.dataplane_turns("failed") == failed + 1


async def test_an_engine_killed_mid_stream_ends_the_reply_without_its_last_chunk(
    stack: Stack,
) -> None:
    failed = await stack.dataplane_turns("failed")
    body = {"model": DOOMED, "stream": True, "messages": HELLO}
    async with (
        asyncio.timeout(30),
        stack.session.post(stack.chat_url, json=body, headers={RUN: "doomed"}) as resp,
    ):
        assert resp.status == 200
        assert resp.headers[RUN] == "doomed"

        async def kill() -> None:
            stack.killed.add("doomed")
            await stack.engines["doomed"].kill()

        raw = await sse_until_broken(resp, kill)
    events = [e for e in raw.split(b"\n\n") if e]
    assert events and all(e.startswith(b"data: {") for e in events)
    assert b"[DONE]" not in raw and b'"finish_reason":"stop"' not in raw
    await stack.settled()
    assert await stack.dataplane_turns("failed") == failed + 1


async def test_an_engine_that_breaks_off_a_plain_reply_gives_a_502(stack: Stack) -> None:
    failed = await stack.dataplane_turns("failed")
    headers = {RUN: "cut-plain", "x-sim-fail": "midstream"}
    async with (
        asyncio.timeout(30),
        stack.session.post(
            stack.chat_url,
            json={"model": SIM_MODEL, "messages": HELLO, "max_tokens": 16},
            headers=headers,
        ) as resp,
    ):
        assert resp.status == 502
        assert resp.headers[RUN] == "cut-plain"
        payload = await resp.json()
    assert payload["error"]["message"].startswith("engine e")
    await stack.settled()
    assert await stack.dataplane_turns("failed") == failed + 1


async def test_an_engine_503_reaches_the_client_unchanged_with_its_retry_after(
    stack: Stack,
) -> None:
    failed = await stack.dataplane_turns("failed")
    async with (
        asyncio.timeout(30),
        stack.session.post(
            stack.chat_url,
            json={"model": SIM_MODEL, "messages": HELLO},
            headers={RUN: "refused", "x-sim-fail": "503"},
        ) as resp,
    ):
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "1"
        assert resp.headers[RUN] == "refused"
        raw = await resp.read()
    expected = wire.error("Simulated failure: status 503.", "server_error")
    assert raw == json.dumps(expected).encode()  # the engine's bytes, as sent
    st = await stack.settled()
    assert st["runs"]["idle"]["interactive"] >= 1
    assert await stack.dataplane_turns("failed") == failed + 1


async def test_a_hosted_429_is_waited_out_and_the_openai_client_gets_the_reply(
    stack: Stack,
) -> None:
    """The hosted engine takes one request per window (3 s) and reports no budget headers, so
    luftpause cannot hold the second turn: of two turns sent together (both in one window
    however slow the machine), one is refused with its Retry-After, waited out by the
    dataplane and sent again; both clients see a reply."""
    finished = await stack.dataplane_turns("finished")
    waited = await stack.dataplane_metric("luftpause_dataplane_rate_limited_total")

    async def turn(run: str) -> str | None:
        async with stack.client(**{RUN: run}) as c:
            reply = await c.chat.completions.create(model=HOSTED, messages=HELLO, max_tokens=4)
            return reply.choices[0].message.content

    async with asyncio.timeout(30):
        replies = await asyncio.gather(turn("rate-limited-a"), turn("rate-limited-b"))
    assert all(replies)
    await stack.settled()
    assert await stack.dataplane_turns("finished") == finished + 2
    assert await stack.dataplane_metric("luftpause_dataplane_rate_limited_total") > waited


async def test_a_429_that_outlasts_the_wait_reaches_the_openai_client_with_its_retry_after(
    stack: Stack,
) -> None:
    """The simulator refuses every try (`x-sim-fail: 429`, Retry-After 1): each refusal cools
    the replica's window down at the scheduler, which holds the next try for it; after the 5 s
    the dataplane may wait, the engine's own 429 reaches the client unchanged."""
    failed = await stack.dataplane_turns("failed")
    retried = await stack.dataplane_turns("retried")
    async with (
        asyncio.timeout(30),
        stack.client(**{RUN: "refused-429", "x-sim-fail": "429"}) as c,
    ):
        with pytest.raises(openai.RateLimitError) as err:
            await c.chat.completions.create(model=SIM_MODEL, messages=HELLO, max_tokens=4)
    response = err.value.response
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "1"
    assert response.headers[RUN] == "refused-429"
    assert response.json()["error"]["type"] == "rate_limit_exceeded"  # the engine's own body
    await stack.settled()
    assert await stack.dataplane_turns("failed") == failed + 1
    # One try per replica of the model per cooldown (two replicas, 1 s, within 5 s), not a spin.
    assert 1 <= await stack.dataplane_turns("retried") - retried <= 14


async def test_an_unknown_model_is_refused_before_queueing_and_nothing_is_recorded(
    stack: Stack,
) -> None:
    before = await stack.settled()
    requests = await stack.requests_total()
    counted = [await stack.dataplane_turns(o) for o in ("finished", "failed", "abandoned")]
    async with asyncio.timeout(10), stack.client(**{RUN: "no-model"}) as c:
        with pytest.raises(openai.NotFoundError) as err:
            await c.chat.completions.create(model="no-such-model", messages=HELLO)
    assert err.value.response.json() == {
        "error": {"message": "no Generative replica serves model 'no-such-model'"}
    }
    assert err.value.response.headers[RUN] == "no-model"
    after = await stack.settled()
    assert after["runs_total"] == before["runs_total"]
    assert await stack.requests_total() == requests
    assert [await stack.dataplane_turns(o) for o in ("finished", "failed", "abandoned")] == counted


async def test_a_run_whose_turns_failed_every_way_is_left_idle_and_its_next_turn_runs(
    stack: Stack,
) -> None:
    """One run through each failure kind; after each, no slot held and the run idle."""
    body = {"model": SIM_MODEL, "messages": HELLO, "max_tokens": 64}
    failed = await stack.dataplane_turns("failed")
    async with asyncio.timeout(60):
        for fail, status in (("503", 503), ("429", 429), ("midstream", 502)):
            async with stack.session.post(
                stack.chat_url, json=body, headers={RUN: "unlucky", "x-sim-fail": fail}
            ) as resp:
                assert resp.status == status
            st = await stack.settled()
            assert st["runs"]["idle"]["interactive"] >= 1
        async with stack.session.post(
            stack.chat_url,
            json={**body, "stream": True},
            headers={RUN: "unlucky", "x-sim-fail": "midstream:2"},
        ) as resp:
            raw = await sse_until_broken(resp, lambda: asyncio.sleep(0))
        assert raw.count(b"data: {") == 2 and b"[DONE]" not in raw
        await stack.settled()
        async with stack.session.post(
            stack.chat_url, json={**body, "stream": True}, headers={RUN: "unlucky"}
        ) as resp:
            await resp.content.readany()  # then this client leaves mid-stream
        await stack.settled()
        assert await stack.dataplane_turns("failed") == failed + 5

        # The check above would see a paused run: a tool call pauses this one, an answer ends it.
        async with stack.client(**{RUN: "unlucky", "x-sim-tool-rounds": "1"}) as c:
            call = await c.chat.completions.create(
                model=SIM_MODEL, messages=HELLO, tools=TOOLS, max_tokens=64
            )
            message = call.choices[0].message
            assert message.tool_calls
            st = await stack.until(lambda s: s["turns_in_flight"] == 0, "the tool call's turn over")
            assert st["runs"]["tool_paused"]["interactive"] == 1
            history: list[Any] = [
                *HELLO,
                message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "ok"},
            ]
            answer = await c.chat.completions.create(
                model=SIM_MODEL, tools=TOOLS, max_tokens=16, messages=history
            )
    assert answer.choices[0].finish_reason == "length" and answer.choices[0].message.content
    assert answer.system_fingerprint == call.system_fingerprint
    await stack.settled()
