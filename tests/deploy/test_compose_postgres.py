"""deploy/compose.postgres.yaml: PostgreSQL, and two runtime replicas on its journal."""

from __future__ import annotations

import pytest

from tests.deploy import containers as c
from tests.deploy.test_compose_files import BASE, DEPLOY, HOSTED_ENV, interpolate, merged

OVERLAY = "compose.postgres.yaml"


@pytest.mark.parametrize("runtime", ["runtime", "runtime-b"])
def test_both_runtimes_journal_to_the_postgres_service_once_it_is_healthy(runtime: str) -> None:
    spec = merged("compose.yaml", OVERLAY)[runtime]
    url = interpolate(spec["environment"]["LUFTPAUSE_JOURNAL"], HOSTED_ENV)
    assert url == "postgresql://luftpause:not-a-secret@postgres:5432/luftpause"
    assert spec["depends_on"]["postgres"] == {"condition": "service_healthy"}


def test_the_replicas_keep_their_state_dirs_apart() -> None:
    services = merged("compose.yaml", OVERLAY)
    mounts = [
        next(v.split(":")[0] for v in services[s]["volumes"] if v.endswith(":/var/lib/luftpause"))
        for s in ("runtime", "runtime-b")
    ]
    assert len(set(mounts)) == 2


def test_the_postgres_overlay_refuses_to_start_without_its_password() -> None:
    try:
        cli = c.compose_cli()
    except c.DockerUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    files = ["-f", str(BASE), "-f", str(DEPLOY / OVERLAY)]
    done = c.run([*cli, *files, "config"], timeout=60, check=False, env={})
    assert done.returncode != 0 and "LUFTPAUSE_PG_PASSWORD" in done.stderr
