"""The Docker engine of the container tests, one per session; stopped at the end if started here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deploy.containers import Daemon, DockerUnavailable


@pytest.fixture(scope="session")
def docker_daemon() -> Iterator[Daemon]:
    try:
        daemon = Daemon().ensure()
    except DockerUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield daemon
    finally:
        daemon.stop()
