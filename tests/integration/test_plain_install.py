"""A plain install gives working services: the wheels, no extras, in a fresh venv.

The seven wheels (the workspace and every distribution of the tree) are built from this
checkout and installed with one `pip install` of their files (their third-party dependencies
from the package index, as a user or a container image gets them) into a venv made with
`python -m venv` without system site packages; then every module of the namespace package
imports there, and the scheduler, dataplane and runtime started by their own commands
(`luftpause-scheduler`, ...) and the fake engine and fake MCP server by the venv's `luftpause`
answer `/health` (and the chain of `/ready`s holds). Takes as long as pip does: some 30 s with a
warm pip cache.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import pytest

from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.stack import Endpoint, write_endpoints
from luftpause.testkit.waits import eventually
from tests.distributions import distributions

# pip may download the dependencies when its cache is cold.
pytestmark = pytest.mark.timeout(360)
# Nothing from this checkout or the user's site may leak into the installed services.
CLEAN_ENV = {"PYTHONPATH": "", "PYTHONNOUSERSITE": "1", "LUFTPAUSE_LOG_FORMAT": "json"}
# Started by their own distributions' commands.
SERVICES = ("scheduler", "dataplane", "runtime")
IMPORT_ALL = """
import importlib, pkgutil, sys, luftpause
portions = list(luftpause.__path__)  # a namespace package, its parts from seven wheels
assert portions and all(p.startswith(sys.prefix) for p in portions), portions
names = [m.name for m in pkgutil.walk_packages(portions, "luftpause.")]
tops = {n.split(".")[1] for n in names}
assert tops == {"cli", "up", "common", "rpc", "scheduler", "dataplane", "runtime", "testkit"}, tops
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def run(*args: str | Path, timeout: float) -> str:
    done = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with every wheel of the tree installed, no extras."""
    work = tmp_path_factory.mktemp("plain-install")
    folders = [dist.folder for dist in distributions().values()]
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", work / "dist", *folders,
        timeout=240)  # fmt: skip
    wheels = sorted((work / "dist").glob("luftpause*.whl"))
    assert len(wheels) == len(folders), wheels
    run(sys.executable, "-m", "venv", work / "venv", timeout=120)
    python = work / "venv" / "bin" / "python"
    assert "include-system-site-packages = false" in (work / "venv" / "pyvenv.cfg").read_text()
    run(python, "-m", "pip", "install", "-q", *wheels, timeout=240)
    return work / "venv"


@pytest.fixture
async def services(venv: Path, tmp_path: Path) -> AsyncIterator[dict[str, str]]:
    """Each service started from the venv: the three services by their own commands, the test
    kit's by `luftpause <subcommand>`; name -> base URL."""
    exe = [str(venv / "bin" / "luftpause")]
    port = {n: free_port() for n in ("engine", "grpc", "http", "dataplane", "runtime", "mcp")}
    url = {n: f"http://127.0.0.1:{p}" for n, p in port.items()}
    config = write_endpoints(
        tmp_path / "endpoints.yaml", [Endpoint(id="e0", url=url["engine"], models=("sim",))]
    )
    commands = {
        "fake-engine": ["fake-engine", "--port", str(port["engine"]), "--model", "sim"],
        "fake-mcp": ["fake-mcp", "--port", str(port["mcp"])],
        "scheduler": ["scheduler", "--config", str(config), "--grpc-port", str(port["grpc"]),
                      "--http-port", str(port["http"])],
        "dataplane": ["dataplane", "--port", str(port["dataplane"]), "--scheduler",
                      f"127.0.0.1:{port['grpc']}", "--config", str(config)],
        "runtime": ["runtime", "--port", str(port["runtime"]), "--dataplane", url["dataplane"],
                    "--state-dir", str(tmp_path / "state")],
    }  # fmt: skip
    bases = {
        "fake-engine": url["engine"],
        "fake-mcp": url["mcp"],
        "scheduler": url["http"],
        "dataplane": url["dataplane"],
        "runtime": url["runtime"],
    }
    async with AsyncExitStack() as exits:
        for name, args in commands.items():
            if name in SERVICES:
                program, args = [str(venv / "bin" / f"luftpause-{name}")], args[1:]
            else:
                program = exe
            proc = await Proc(
                args, name=name, program=program, env=CLEAN_ENV, log_path=tmp_path / f"{name}.log"
            ).start()
            exits.push_async_callback(proc.stop)
        yield bases


def test_every_module_of_the_package_imports_in_a_plain_install(venv: Path) -> None:
    count = run(venv / "bin" / "python", "-c", IMPORT_ALL, timeout=120)
    assert int(count) > 50


async def test_each_service_from_a_plain_install_answers_health(
    services: dict[str, str],
) -> None:
    async with aiohttp.ClientSession() as http, asyncio.timeout(90):
        for name, base in services.items():
            assert await status_once_up(http, base + "/health") == 200, name
        # The readiness chain: engines probed, dataplane in session, runtime sees it ready.
        for name in ("scheduler", "dataplane", "runtime"):
            await until_ready(http, name, services[name])
        async with http.get(services["dataplane"] + "/v1/models") as resp:
            assert [m["id"] for m in (await resp.json())["data"]] == ["sim"]


async def until_ready(http: aiohttp.ClientSession, name: str, base: str) -> None:
    await eventually(
        lambda: status_once_up(http, base + "/ready"),
        lambda status: status == 200,
        f"{name} to answer /ready with 200",
        every=0.1,
    )


async def status_once_up(http: aiohttp.ClientSession, url: str) -> int:
    """The status `url` answers, once something listens there (the caller bounds the wait)."""
    while True:
        try:
            async with http.get(url) as resp:
                return resp.status
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.1)
