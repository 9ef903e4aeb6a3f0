"""`/v1/decide` and bearer auth end to end, with real processes on loopback.

A generative simulator, a single-pass simulator (`kind: single-pass`, vLLM's `/classify`), the
scheduler, and two dataplanes on it: one without `LUFTPAUSE_TOKEN`, one with it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from luftpause.testkit.stack import Launcher, write_endpoints
from luftpause.testkit.waits import until_status

pytestmark = pytest.mark.asyncio(loop_scope="module")

GEN_MODEL = "luftpause-sim"
CLF_MODEL = "sim-classifier"
CLF_LABELS = ("urgent", "lookup", "chitchat")
TOKEN = "integration-token"


@dataclass(frozen=True, slots=True, kw_only=True)
class Decide:
    open_url: str
    guarded_url: str
    status_url: str
    open_log: Path
    guarded_log: Path


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def decide_stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Decide]:
    workdir = tmp_path_factory.mktemp("decide")
    async with AsyncExitStack() as exits:
        launcher = Launcher(workdir, exits)
        fast = ("--time-scale", "20")
        generative = await launcher.engine("gen-0", *fast, models=[GEN_MODEL])
        labels = ("--kind", "single-pass", "--labels", ",".join(CLF_LABELS))
        single_pass = await launcher.engine(
            "clf-0", *labels, *fast, models=[CLF_MODEL], options={"kind": "single-pass"}
        )
        config = write_endpoints(workdir / "endpoints.yaml", [generative, single_pass])
        scheduler = await launcher.scheduler(config)
        dataplanes = {
            name: await launcher.dataplane(
                scheduler, name=f"dataplane-{name}", config=config, env={"LUFTPAUSE_TOKEN": token}
            )
            for name, token in (("open", ""), ("guarded", TOKEN))
        }
        await until_status(
            scheduler.status_url,
            lambda st: all(r["healthy"] for r in st["replicas"]),
            "both replicas healthy",
        )
        yield Decide(
            open_url=dataplanes["open"].url,
            guarded_url=dataplanes["guarded"].url,
            status_url=scheduler.status_url,
            open_log=workdir / "dataplane-open.log",
            guarded_log=workdir / "dataplane-guarded.log",
        )


async def _post(url: str, body: Any, **headers: str) -> tuple[int, dict[str, str], Any]:
    async with (
        asyncio.timeout(30),
        aiohttp.ClientSession() as s,
        s.post(url, json=body, headers=headers) as resp,
    ):
        return resp.status, dict(resp.headers), json.loads(await resp.read())


async def test_decide_classifies_on_the_single_pass_replica(decide_stack: Decide) -> None:
    body = {"model": CLF_MODEL, "input": ["the server is down and the pager rings", "hello"]}
    status, headers, doc = await _post(
        decide_stack.open_url + "/v1/decide", body, **{"x-luftpause-run-id": "run-clf"}
    )
    assert status == 200 and headers["x-luftpause-run-id"] == "run-clf"
    assert doc["model"] == CLF_MODEL and len(doc["data"]) == 2
    for item in doc["data"]:
        assert item["label"] in CLF_LABELS and len(item["probs"]) == len(CLF_LABELS)
        assert sum(item["probs"]) == pytest.approx(1.0)
    await until_status(
        decide_stack.status_url,
        lambda st: next(r for r in st["replicas"] if r["id"] == "clf-0")["in_flight"] == 0,
        "the decide turn reported finished: clf-0's slot free",
    )


async def test_decide_classify_gets_a_fresh_run_id_without_one(decide_stack: Decide) -> None:
    status, headers, _ = await _post(
        decide_stack.open_url + "/v1/decide", {"model": CLF_MODEL, "input": "x"}
    )
    assert status == 200 and headers["x-luftpause-run-id"]


async def test_decide_for_a_model_no_single_pass_replica_serves_is_404(
    decide_stack: Decide,
) -> None:
    for model in ("nope", GEN_MODEL):
        status, headers, doc = await _post(
            decide_stack.open_url + "/v1/decide", {"model": model, "input": "x"}
        )
        assert status == 404 and headers["x-luftpause-run-id"]
        assert doc == {"error": {"message": f"no Single-pass replica serves model '{model}'"}}


async def test_decide_with_labels_scores_them_on_the_generative_replica(
    decide_stack: Decide,
) -> None:
    labels = ["billing", "outage", "question"]
    body = {"model": GEN_MODEL, "input": "the site has been down for an hour", "labels": labels}
    status, headers, doc = await _post(
        decide_stack.open_url + "/v1/decide", body, **{"x-luftpause-run-id": "run-labels"}
    )
    assert status == 200 and headers["x-luftpause-run-id"] == "run-labels"
    assert doc["model"] == GEN_MODEL and doc["label"] in labels
    assert set(doc["probabilities"]) | set(doc["unscored"]) == set(labels)
    assert sum(doc["probabilities"].values()) == pytest.approx(1.0)
    assert doc["probabilities"][doc["label"]] == max(doc["probabilities"].values())


async def test_decide_with_labels_on_a_classifier_model_is_404(decide_stack: Decide) -> None:
    body = {"model": CLF_MODEL, "input": "x", "labels": ["a", "b"]}
    status, _, doc = await _post(decide_stack.open_url + "/v1/decide", body)
    assert status == 404
    assert doc == {"error": {"message": f"no Generative replica serves model '{CLF_MODEL}'"}}


async def test_decide_with_bad_labels_is_400(decide_stack: Decide) -> None:
    for labels in (["one"], ["a", "A"], [f"l{i}" for i in range(21)], ["a", ""]):
        body = {"model": GEN_MODEL, "input": "x", "labels": labels}
        status, _, doc = await _post(decide_stack.open_url + "/v1/decide", body)
        assert status == 400 and doc["error"]["message"], labels


CHAT = {"model": GEN_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def test_with_a_token_v1_routes_need_it(decide_stack: Decide) -> None:
    url = decide_stack.guarded_url
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        for path, body in (("/v1/chat/completions", CHAT), ("/v1/decide", {})):
            status, resp_headers, doc = await _post(url + path, body, **headers)
            assert status == 401 and resp_headers["WWW-Authenticate"] == "Bearer"
            assert doc["error"]["message"]
        async with aiohttp.ClientSession() as s, s.get(url + "/v1/models", headers=headers) as r:
            assert r.status == 401


async def test_with_a_token_the_right_bearer_gets_through(decide_stack: Decide) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    status, headers, doc = await _post(
        decide_stack.guarded_url + "/v1/chat/completions", CHAT, **bearer
    )
    assert status == 200 and headers["x-luftpause-run-id"] and doc["choices"]
    status, _, doc = await _post(
        decide_stack.guarded_url + "/v1/decide", {"model": CLF_MODEL, "input": "x"}, **bearer
    )
    assert status == 200 and doc["data"]
    async with aiohttp.ClientSession() as s:
        for path in ("/health", "/metrics"):
            async with s.get(decide_stack.guarded_url + path) as resp:
                assert resp.status == 200, path


async def test_without_a_token_everyone_is_accepted_and_a_warning_logged(
    decide_stack: Decide,
) -> None:
    status, _, _ = await _post(
        decide_stack.open_url + "/v1/chat/completions", CHAT, Authorization="Bearer whatever"
    )
    assert status == 200
    assert "auth is off" in decide_stack.open_log.read_text()
    assert "auth is off" not in decide_stack.guarded_log.read_text()
