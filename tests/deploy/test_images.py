"""Each service image holds its own distribution and what that one needs, and nothing else.

On real images: built by `make images` on `luftpause-base:local` (as tests/deploy/test_compose.py
builds them; the layer cache makes a second build seconds), each run once with its own python3 to
import a list of modules and look up a list of commands. The dataplane cannot import the MCP SDK,
the runtime cannot import the generated gRPC code, no service image has another service, the test
kit or the workspace's `luftpause` command, and each has its own command and imports its own main.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.deploy import containers as c
from tests.deploy.containers import Daemon

pytestmark = pytest.mark.timeout(2400)

SERVICES = ("scheduler", "dataplane", "runtime")
# Run in the image: for each argument, a module (None when it imports, else the name of the
# module that was not found) or `command:<name>` (its path on PATH, or None).
PROBE = """
import importlib, json, shutil, sys
found = {}
for arg in sys.argv[1:]:
    if arg.startswith("command:"):
        found[arg] = shutil.which(arg.removeprefix("command:"))
        continue
    try:
        importlib.import_module(arg)
        found[arg] = None
    except ModuleNotFoundError as exc:
        found[arg] = exc.name
print(json.dumps(found))
"""
# Per image: what must import, and what must not be there at all.
PRESENT = {
    "scheduler": ("luftpause.scheduler.main", "luftpause.common.config", "luftpause.rpc"),
    "dataplane": ("luftpause.dataplane.main", "luftpause.common.config", "luftpause.rpc"),
    "runtime": ("luftpause.runtime.main", "luftpause.common.config", "mcp"),
}
ABSENT = {
    "scheduler": ("mcp", "openai", "luftpause.dataplane", "luftpause.runtime"),
    "dataplane": ("mcp", "openai", "luftpause.scheduler", "luftpause.runtime"),
    "runtime": ("openai", "luftpause.rpc", "luftpause.scheduler", "luftpause.dataplane"),
}
NOWHERE = ("luftpause.testkit", "luftpause.cli", "luftpause.up")


@pytest.fixture(scope="module")
def images(docker_daemon: Daemon) -> Iterator[str]:
    docker = docker_daemon.docker
    c.build_base(docker)
    c.build_images(docker, SERVICES, base_image=c.LOCAL_BASE, ca_certs=c.HOST_CA_DIR)
    yield docker


def probe(docker: str, image: str, args: list[str]) -> dict[str, str | None]:
    """What `PROBE` finds in `image` for `args`."""
    done = c.run(
        [docker, "run", "--rm", "--entrypoint", "python3", image, "-c", PROBE, *args],
        timeout=120,
    )
    found: dict[str, str | None] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("name", SERVICES)
def test_each_service_image_holds_its_own_code_and_command_and_no_other_service(
    images: str, name: str
) -> None:
    absent = [*ABSENT[name], *NOWHERE]
    others = [f"command:luftpause-{other}" for other in SERVICES if other != name]
    commands = [f"command:luftpause-{name}", "command:luftpause", *others]
    found = probe(images, f"luftpause/{name}:{c.VERSION}", [*PRESENT[name], *absent, *commands])
    assert {m: found[m] for m in PRESENT[name]} == dict.fromkeys(PRESENT[name])
    # Not there at all: the module itself is what is not found, not one of its imports.
    assert {m: found[m] for m in absent} == {m: m for m in absent}
    assert found[f"command:luftpause-{name}"] == f"/opt/luftpause/bin/luftpause-{name}"
    assert {cmd: found[cmd] for cmd in ["command:luftpause", *others]} == dict.fromkeys(
        ["command:luftpause", *others]
    )


def test_the_dataplane_image_cannot_import_mcp_and_the_runtime_image_the_grpc_code(
    images: str,
) -> None:
    """The issue's two checks, by name."""
    dataplane = probe(images, f"luftpause/dataplane:{c.VERSION}", ["mcp"])
    runtime = probe(images, f"luftpause/runtime:{c.VERSION}", ["luftpause.rpc"])
    assert (dataplane, runtime) == ({"mcp": "mcp"}, {"luftpause.rpc": "luftpause.rpc"})
