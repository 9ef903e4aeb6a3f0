"""What the container tests share: a Docker engine, the local base image, the images, Compose.

Shell module: runs `dockerd`, `docker`, `docker-compose` (or `docker compose`), `make` and
deploy/docker/base/build-base.sh as child processes, each with a timeout. `make docker-tools`
installs Debian's docker.io, docker-compose and mmdebstrap.

- `Daemon.ensure()` uses the engine that answers on the default socket, or starts `dockerd`
  (log in a temporary directory) and waits for it; `stop()` stops only a daemon it started.
- `build_base()` makes `luftpause-base:local` from Debian packages when it is missing (no
  registry is reachable here, so python:3.11-slim cannot be pulled).
- `build_images()` runs `make images` once per image, so each build is timed on its own; the
  shared layers make every image after the first cost seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ROOT / "deploy" / "docker"
VERSION: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# The images deploy/compose.yaml runs, and every image `make images` builds.
STACK_IMAGES = ("scheduler", "dataplane", "runtime", "fake-engine", "fake-mcp")
ALL_IMAGES = (*STACK_IMAGES, "llama-engine")
LOCAL_BASE = "luftpause-base:local"
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
DAEMON_START_TIMEOUT = 90.0
BASE_BUILD_TIMEOUT = 1200.0
IMAGE_BUILD_TIMEOUT = 1200.0


class DockerUnavailable(RuntimeError):
    """No Docker engine could be reached or started; the message says what to do."""


def run(
    args: Sequence[str | Path],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    cwd: Path = ROOT,
) -> subprocess.CompletedProcess[str]:
    """Run a command to its end within `timeout`; with `check`, fail with its output."""
    done = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
    )
    if check and done.returncode != 0:
        command = " ".join(str(a) for a in args)
        raise RuntimeError(f"`{command}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def docker_cli() -> str:
    """Debian's client (it matches Debian's engine), else the first `docker` on PATH."""
    for candidate in ("/usr/bin/docker", shutil.which("docker")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise DockerUnavailable("no docker client: `make docker-tools` installs Debian's docker.io")


def compose_cli() -> list[str]:
    """`docker-compose` (Debian's v1.29) when installed, else the `docker compose` plugin."""
    v1 = shutil.which("docker-compose")
    if v1:
        return [v1]
    plugin = run([docker_cli(), "compose", "version"], timeout=30, check=False)
    if plugin.returncode == 0:
        return [docker_cli(), "compose"]
    raise DockerUnavailable("no Compose: `make docker-tools` installs Debian's docker-compose")


@dataclass
class Daemon:
    """The Docker engine the tests use; started here only when none answers."""

    docker: str = field(default_factory=docker_cli)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def answers(self) -> bool:
        return run([self.docker, "info"], timeout=30, check=False).returncode == 0

    def ensure(self) -> Daemon:
        if self.answers():
            return self
        dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
        if not os.access(dockerd, os.X_OK):
            raise DockerUnavailable("no dockerd: `make docker-tools` installs Debian's docker.io")
        self.log_path = Path(tempfile.mkdtemp(prefix="luftpause-dockerd-")) / "dockerd.log"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [dockerd],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + DAEMON_START_TIMEOUT
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise DockerUnavailable(f"dockerd did not come up (log {self.log_path}):\n{tail}")
            time.sleep(0.5)
        return self

    def stop(self) -> None:
        """Stop the daemon this object started (by its PID), nothing else."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def image_exists(docker: str, image: str) -> bool:
    return run([docker, "image", "inspect", image], timeout=30, check=False).returncode == 0


def build_base(docker: str, image: str = LOCAL_BASE) -> float:
    """Build the local Debian base image unless it exists; the seconds it took (0 if it was)."""
    if image_exists(docker, image):
        return 0.0
    started = time.monotonic()
    run(
        [DOCKERFILES / "base" / "build-base.sh", image],
        timeout=BASE_BUILD_TIMEOUT,
        env={"DOCKER": docker},
    )
    return time.monotonic() - started


def build_images(
    docker: str,
    names: Sequence[str],
    *,
    base_image: str,
    ca_certs: Path | str = "deploy/docker/ca",
) -> dict[str, float]:
    """`make images` for each image in turn; name -> seconds its build took."""
    make = shutil.which("make") or "make"
    seconds: dict[str, float] = {}
    for name in names:
        started = time.monotonic()
        run(
            [
                make,
                "--no-print-directory",
                "images",
                f"IMAGES={name}",
                f"BASE_IMAGE={base_image}",
                f"CA_CERTS={ca_certs}",
                f"DOCKER={docker}",
            ],
            timeout=IMAGE_BUILD_TIMEOUT,
        )
        seconds[name] = round(time.monotonic() - started, 1)
    return seconds


def image_size(docker: str, image: str) -> int:
    """The image's size in bytes, its base image included."""
    out = run([docker, "image", "inspect", "--format", "{{.Size}}", image], timeout=30)
    return int(out.stdout.strip())


def started_at(docker: str, container: str) -> str:
    """When the container last started; "" while it is not running."""
    out = run(
        [docker, "inspect", "--format", "{{.State.Running}} {{.State.StartedAt}}", container],
        timeout=30,
        check=False,
    )
    running, _, when = out.stdout.strip().partition(" ")
    return when if running == "true" else ""


def leftovers(docker: str, project: str) -> list[str]:
    """Containers, networks and volumes still labelled with the Compose project."""
    label = f"label=com.docker.compose.project={project}"
    found = []
    for kind in (["ps", "-a"], ["network", "ls"], ["volume", "ls"]):
        out = run([docker, *kind, "-q", "--filter", label], timeout=30, check=False)
        found += [f"{kind[0]} {line}" for line in out.stdout.split() if line]
    return found
