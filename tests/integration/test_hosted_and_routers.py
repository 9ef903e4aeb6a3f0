"""Hosted endpoints over https with a key, and routers whose load comes from `load_from`.

Real processes on loopback: simulated engines (one serving https with a private CA and requiring
an API key), `luftpause scheduler` and `luftpause dataplane`, driven with the official openai
client. The scheduler and dataplane trust the CA only through the standard `SSL_CERT_FILE`
variable; certificate verification stays on everywhere.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from openai import AsyncOpenAI

from luftpause.scheduler.engine_load import Load, parse_load
from luftpause.testkit.stack import Launcher, Scheduler, write_endpoints
from luftpause.testkit.status import fetch_status
from luftpause.testkit.waits import eventually, read_metrics, until_status

pytestmark = pytest.mark.asyncio(loop_scope="module")

HOSTED_MODEL = "hosted-sim"
ROUTED_MODEL = "routed-sim"
KEY = "secret"
# The hosted engine's rate limits (its hosted-API mode): far more than the tests use.
HOSTED_RPM, HOSTED_TPM = 10_000, 10_000_000
HOSTED_LIMITS = ("--rpm", str(HOSTED_RPM), "--tpm", str(HOSTED_TPM))
PROBE_PERIOD = "0.3"
# Engines behind the router: room for two requests of 10 prompt + 64 reply tokens in 160 KV
# tokens (blocks of 16), and a decode step of a second, so the rest wait for a long while.
# Engines that run two requests at once: five sent to each queue three.
BEHIND_ARGS = ("--max-running", "2", "--decode-base-ms", "1000", "--time-scale", "1")


# --- a private CA and a server certificate for 127.0.0.1 ------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def write_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A self-signed CA and a server certificate for IP 127.0.0.1; returns (ca, cert, key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("luftpause test CA"))
        .issuer_name(_name("luftpause test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = (directory / n for n in ("ca.pem", "server.pem", "key.pem"))
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_path, cert_path, key_path


# --- the stack --------------------------------------------------------------------------------


@dataclass
class Stack:
    launcher: Launcher
    config: Path
    ca: Path
    hosted_url: str
    behind_urls: tuple[str, ...]
    tls: ssl.SSLContext
    status_url: str = ""
    dataplane_url: str = ""

    async def scheduler(self, name: str, env: dict[str, str]) -> Scheduler:
        """A scheduler on the endpoint file, with `env` on top of this process's environment."""
        return await self.launcher.scheduler(
            self.config, "--probe-period", PROBE_PERIOD, name=name, env=env
        )

    async def debug_requests(self) -> list[dict[str, Any]]:
        """What the hosted engine received (method, path, headers), over verified https."""
        connector = aiohttp.TCPConnector(ssl=self.tls)
        async with (
            aiohttp.ClientSession(connector=connector) as s,
            s.get(self.hosted_url + "/debug/requests") as resp,
        ):
            assert resp.status == 200
            body = await resp.json()
        requests: list[dict[str, Any]] = body["requests"]
        return requests


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    """Engines (hosted over https with a key, a router stand-in, two behind it), scheduler and
    dataplane; the last two get the key and trust the test CA through SSL_CERT_FILE."""
    workdir = tmp_path_factory.mktemp("hosted")
    ca, cert, key = write_certificates(workdir)
    async with AsyncExitStack() as exits:
        launcher = Launcher(workdir, exits)
        fast = ("--time-scale", "20")
        hosted = await launcher.engine(
            "hosted",
            "--require-key",
            KEY,
            *fast,
            *HOSTED_LIMITS,
            models=[HOSTED_MODEL],
            tls=(cert, key),
            options={"health": "/v1/models", "metrics": "", "api_key_env": "HOSTED_KEY"},
        )
        behind = [
            await launcher.engine(f"behind-{i}", *BEHIND_ARGS, models=[ROUTED_MODEL])
            for i in range(2)
        ]
        router = await launcher.engine(
            "router", *fast, models=[ROUTED_MODEL], options={"load_from": [e.url for e in behind]}
        )
        s = Stack(
            launcher=launcher,
            config=write_endpoints(workdir / "endpoints.yaml", [hosted, router]),
            ca=ca,
            hosted_url=hosted.url,
            behind_urls=tuple(e.url for e in behind),
            tls=ssl.create_default_context(cafile=str(ca)),
        )
        env = {"HOSTED_KEY": KEY, "SSL_CERT_FILE": str(ca)}
        scheduler = await s.scheduler("scheduler", env)
        s.status_url = scheduler.status_url
        dataplane = await launcher.dataplane(scheduler, config=s.config, env=env)
        s.dataplane_url = dataplane.base_url
        yield s


# --- helpers ---------------------------------------------------------------------------------


def replica_of(status: dict[str, Any], rid: str) -> dict[str, Any]:
    found: dict[str, Any] = next(r for r in status["replicas"] if r["id"] == rid)
    return found


async def replica(status_url: str, rid: str) -> dict[str, Any]:
    return replica_of(await fetch_status(status_url), rid)


async def wait_replica(status_url: str, rid: str, **expected: Any) -> dict[str, Any]:
    """Until replica `rid` shows every expected field."""
    status = await until_status(
        status_url,
        lambda st: all(replica_of(st, rid)[k] == v for k, v in expected.items()),
        f"replica {rid} to show {expected}",
    )
    return replica_of(status, rid)


async def engine_load(url: str) -> Load | None:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as resp:
        return parse_load(await resp.text())


def headers_of(entry: dict[str, Any]) -> dict[str, str]:
    return {k.lower(): v for k, v in entry["headers"].items()}


def without_key_or_trust(monkeypatch: pytest.MonkeyPatch) -> None:
    """Children inherit this process's environment: make sure it holds neither variable."""
    monkeypatch.delenv("HOSTED_KEY", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)


# --- hosted endpoint over https with a key ----------------------------------------------------


async def test_completion_reaches_the_hosted_https_engine_with_its_key_not_the_clients(
    stack: Stack,
) -> None:
    await wait_replica(stack.status_url, "hosted", healthy=True)
    async with (
        asyncio.timeout(30),
        AsyncOpenAI(
            base_url=stack.dataplane_url, api_key="client-token", max_retries=0, timeout=30
        ) as client,
    ):
        reply = await client.chat.completions.create(
            model=HOSTED_MODEL, messages=[{"role": "user", "content": "hello over https"}]
        )
    assert reply.system_fingerprint == "hosted"
    assert reply.choices[0].message.content
    seen = await stack.debug_requests()
    chats = [e for e in seen if e["path"] == "/v1/chat/completions"]
    assert chats and all(headers_of(e).get("authorization") == f"Bearer {KEY}" for e in chats)
    assert not any("client-token" in str(e["headers"]) for e in seen)


async def test_the_dataplane_shows_the_hosted_replicas_rate_limit_budget(stack: Stack) -> None:
    await wait_replica(stack.status_url, "hosted", healthy=True)
    async with (
        asyncio.timeout(30),
        AsyncOpenAI(base_url=stack.dataplane_url, api_key="x", max_retries=0) as client,
    ):
        await client.chat.completions.create(
            model=HOSTED_MODEL, messages=[{"role": "user", "content": "how much is left?"}]
        )
    metrics = await read_metrics(stack.dataplane_url.removesuffix("/v1") + "/metrics")
    label = '{budget="requests",replica="hosted"}'
    assert metrics[f"luftpause_dataplane_ratelimit_limit{label}"] == HOSTED_RPM
    assert 0 <= metrics[f"luftpause_dataplane_ratelimit_remaining{label}"] < HOSTED_RPM
    tokens = '{budget="tokens",replica="hosted"}'
    assert metrics[f"luftpause_dataplane_ratelimit_remaining{tokens}"] < HOSTED_TPM
    resets = metrics[f"luftpause_dataplane_ratelimit_reset_timestamp_seconds{label}"]
    # The window is 60 simulated seconds, 3 s at this time scale: it may have refilled since.
    assert -10 < resets - datetime.datetime.now(datetime.UTC).timestamp() <= 3
    assert metrics.get("luftpause_dataplane_ratelimit_headers_malformed_total", 0) == 0


async def test_scheduler_probes_the_hosted_health_path_with_the_key(stack: Stack) -> None:
    r = await wait_replica(stack.status_url, "hosted", healthy=True)
    # No engine metrics on a hosted API. (Whether it is `capped` depends on the tests before:
    # one turn at a time until a reply's rate-limit headers have been read.)
    assert r["engine_running"] is None
    seen = await stack.debug_requests()
    probes = [e for e in seen if e["method"] == "GET" and e["path"] == "/v1/models"]
    assert any(headers_of(e).get("authorization") == f"Bearer {KEY}" for e in probes)


async def test_hosted_replica_is_unhealthy_when_its_key_variable_is_unset(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    without_key_or_trust(monkeypatch)
    keyless = await stack.scheduler("scheduler-keyless", {"SSL_CERT_FILE": str(stack.ca)})
    # Once the router is healthy a whole probe round has been applied, the hosted probe with it.
    await wait_replica(keyless.status_url, "router", healthy=True)
    assert (await replica(keyless.status_url, "hosted"))["healthy"] is False
    await eventually(  # the keyless probes reached the engine over TLS and got its 401
        stack.debug_requests,
        lambda seen: any(
            e["path"] == "/v1/models" and "authorization" not in headers_of(e) for e in seen
        ),
        "a probe without the key at the hosted engine",
        every=0.1,
    )
    assert (await replica(keyless.status_url, "hosted"))["healthy"] is False


async def test_hosted_replica_with_a_certificate_the_scheduler_does_not_trust_is_unhealthy(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    without_key_or_trust(monkeypatch)
    untrusting = await stack.scheduler("scheduler-untrusting", {"HOSTED_KEY": KEY})
    # Once the router is healthy a whole probe round has been applied, the hosted probe with it.
    await wait_replica(untrusting.status_url, "router", healthy=True)
    assert (await replica(untrusting.status_url, "hosted"))["healthy"] is False


# --- a router whose load is read from the engines behind it -----------------------------------


async def test_idle_router_is_uncapped_and_serves_turns(stack: Stack) -> None:
    r = await wait_replica(stack.status_url, "router", healthy=True, engine_waiting=0)
    assert r["capped"] is False and r["engine_running"] == 0
    async with (
        asyncio.timeout(30),
        AsyncOpenAI(base_url=stack.dataplane_url, api_key="x", max_retries=0, timeout=30) as c,
    ):
        reply = await c.chat.completions.create(
            model=ROUTED_MODEL, messages=[{"role": "user", "content": "hi router"}]
        )
    assert reply.system_fingerprint == "router"


async def test_router_is_capped_at_the_most_the_engines_behind_it_run_while_they_queue(
    stack: Stack,
) -> None:
    await wait_replica(stack.status_url, "router", healthy=True, capped=False)
    clients = [
        AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=90)
        for url in stack.behind_urls
    ]

    async def occupy(client: AsyncOpenAI, i: int) -> None:
        await client.chat.completions.create(
            model=ROUTED_MODEL,
            messages=[{"role": "user", "content": f"load {i}"}],
            max_tokens=64,
        )

    async def steady() -> tuple[Load, dict[str, Any]] | None:
        """The load summed over the engines behind, with the router as the scheduler showed it
        meanwhile; None while that load moved or nothing queued."""
        before = [await engine_load(u) for u in stack.behind_urls]
        r = await replica(stack.status_url, "router")
        after = [await engine_load(u) for u in stack.behind_urls]
        loads = [b for b in before if b is not None and b.waiting > 0]
        if before != after or len(loads) < len(before):
            return None
        total = Load(running=sum(b.running for b in loads), waiting=sum(b.waiting for b in loads))
        return total, r

    def both_at_their_most(found: tuple[Load, dict[str, Any]] | None) -> bool:
        if found is None:
            return False
        total, r = found
        seen = (r["engine_running"], r["engine_waiting"])
        return seen == (total.running, total.waiting) and total.running == 4

    tasks = [asyncio.create_task(occupy(c, i)) for c in clients for i in range(5)]
    try:
        found = await eventually(
            steady,
            both_at_their_most,
            "the router to show the load behind it: two running on each engine, more queued",
            every=0.1,
        )
        assert found is not None
        total, r = found
        assert r["capped"] is True and r["capacity"] == total.running == 4
        assert total.waiting > 0 and total.running >= 2
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in clients:
            await client.close()
    # Aborted by the disconnects, the engines are idle again, and so the router is uncapped.
    r = await wait_replica(stack.status_url, "router", engine_running=0, engine_waiting=0)
    assert r["capped"] is False
