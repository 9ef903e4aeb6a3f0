"""What the Kubernetes manifests' tests share: rendering the overlays and reading what they say.

Each overlay is rendered with `kubectl kustomize` and checked by `kubernetes-validate --strict`;
`make install` installs both into the venv (the dev extra). Nothing here talks to a cluster.

What "agree with the code" means: every `LUFTPAUSE_*` variable a container sets is an option of
the subcommand its image runs (the parsers `luftpause <subcommand>` builds, named as
`common.envargs` names them: `--some-flag` -> `LUFTPAUSE_SOME_FLAG`), and each service given a
container's environment gets the values the manifests mean; the ports, probe paths, the gRPC
health service name, the endpoint file's mount and the journal's volume are the ones the
services use.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn
from unittest import mock

import pytest
import yaml

from luftpause import cli
from luftpause.common import envargs

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("dev", "production", "production-postgres")
NAMESPACES = {"dev": "luftpause-dev", "production": "luftpause", "production-postgres": "luftpause"}
# The overlays whose runtime keeps its journal in a file on a volume (a StatefulSet of one); the
# others keep it in PostgreSQL (a Deployment of replicas, components/postgres-journal).
FILE_JOURNAL = ("dev", "production")
# The oldest Kubernetes we claim (gRPC probes are GA since 1.27) and the newest the tool knows.
K8S_VERSIONS = ("1.30.0", "1.37.0")
IMAGE_UID = 10001
WORKLOADS = ("Deployment", "StatefulSet")
# Per service: container port name -> the option that sets the port it listens on.
PORT_OPTIONS = {
    "scheduler": {"grpc": "--grpc-port", "http": "--http-port"},
    "dataplane": {"http": "--port"},
    "runtime": {"http": "--port"},
    "fake-engine": {"http": "--port"},
    "fake-mcp": {"http": "--port"},
    "llama-engine": {"http": "--port"},
}
# Services with bearer auth: the module whose OPEN_PATHS are served without the token.
OPEN_PATHS_MODULE = {
    "dataplane": "luftpause.common.auth",
    "runtime": "luftpause.runtime.server.auth",
}

Doc = dict[str, Any]


def missing(what: str) -> NoReturn:
    pytest.fail(f"{what} is missing: `make install` installs it (the dev extra)", pytrace=False)


def tool(name: str) -> str:
    """The venv's copy of a tool (the pinned one `make install` installs), else one on PATH."""
    here = Path(sys.executable).parent / name
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which(name) or missing(name)


@functools.cache
def render(overlay: str) -> tuple[Doc, ...]:
    kubectl = tool("kubectl")
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(
            f"{kubectl} kustomize overlays/{overlay} failed (an old kubectl? `make install` "
            f"installs a current one):\n{done.stderr}",
            pytrace=False,
        )
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def of_kind(docs: tuple[Doc, ...], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: tuple[Doc, ...], kind: str, name: str) -> Doc:
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def workloads(docs: tuple[Doc, ...]) -> list[Doc]:
    return [d for d in docs if d["kind"] in WORKLOADS]


def pod(docs: tuple[Doc, ...], name: str) -> Doc:
    """The pod template of the Deployment or StatefulSet `name`."""
    (found,) = [w for w in workloads(docs) if w["metadata"]["name"] == name]
    template: Doc = found["spec"]["template"]
    return template


def service_of(container: Doc) -> str:
    """The subcommand a container's image runs: luftpause/<subcommand>[:tag]."""
    repo, _, _ = container["image"].partition(":")
    owner, _, name = repo.rpartition("/")
    assert owner.endswith("luftpause"), f"not a luftpause image: {container['image']}"
    return name


def containers(docs: tuple[Doc, ...]) -> Iterator[tuple[Doc, Doc]]:
    """(pod template, container) for every container of every workload."""
    for workload in workloads(docs):
        pod = workload["spec"]["template"]
        spec = pod["spec"]
        for container in spec.get("initContainers", []) + spec["containers"]:
            yield pod, container


def main_container(docs: tuple[Doc, ...], service: str) -> tuple[Doc, Doc]:
    found = [(p, c) for p, c in containers(docs) if service_of(c) == service]
    assert len(found) == 1, f"expected one {service} container, found {len(found)}"
    return found[0]


def ports(container: Doc) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def resolve(port: int | str, pod: Doc) -> int | None:
    """A numeric or named port of any container of the pod, as a number (None: no such name)."""
    if isinstance(port, int):
        return port
    for container in pod["spec"]["containers"]:
        if port in ports(container):
            return ports(container)[port]
    return None


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    assert not selector.get("matchExpressions"), "this check reads matchLabels only"
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


# --- the services' own options --------------------------------------------------------------


class _Parsed(Exception):
    """Raised in place of the command's final `parse_args`, so the command goes no further."""


@functools.cache
def parsers(subcommand: str) -> tuple[argparse.ArgumentParser, ...]:
    """The parsers `luftpause <subcommand>` builds, the final one last (no LUFTPAUSE_* set).

    A pre-parser (`parse_known_args`, say for fake-engine's --profile) runs as usual; the final
    `parse_args` raises instead of parsing, before the command starts anything.
    """
    assert subcommand in cli.SUBCOMMANDS, f"no subcommand {subcommand!r} in luftpause.cli"
    seen: list[argparse.ArgumentParser] = []
    known_args = argparse.ArgumentParser.parse_known_args

    def pre(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        seen.append(self)
        return known_args(self, *args, **kwargs)

    def final(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> NoReturn:
        seen.append(self)
        raise _Parsed

    clean = {k: v for k, v in os.environ.items() if not k.startswith(envargs.PREFIX)}
    with (
        mock.patch.object(argparse.ArgumentParser, "parse_known_args", pre),
        mock.patch.object(argparse.ArgumentParser, "parse_args", final),
        mock.patch.dict(os.environ, clean, clear=True),
        contextlib.suppress(_Parsed),
    ):
        cli.main([subcommand])
    assert seen, f"luftpause {subcommand} returned without parsing its options"
    return tuple(seen)


def options(subcommand: str) -> dict[str, Any]:
    """`LUFTPAUSE_*` variable -> its option's default, as `envargs` names them."""
    return {
        variable: action.default
        for parser in parsers(subcommand)
        for action, variable in envargs.options(parser)
    }


def setting(container: Doc, option: str) -> str | None:
    """What the container runs with for `option`: its LUFTPAUSE_* value, else the default."""
    name = envargs.env_name(option)
    for var in container.get("env", []):
        if var["name"] == name:
            return var.get("value")
    default = options(service_of(container))[name]
    return None if default is None else str(default)


def configmap_file(docs: tuple[Doc, ...], pod: Doc, container: Doc, path: str) -> str:
    """The text of the file at `path` in the container, which must come from a ConfigMap."""
    file = PurePosixPath(path)
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        if "configMap" not in volume:
            continue
        mounted = PurePosixPath(mount["mountPath"])
        key = mount.get("subPath") if mounted == file else None
        if key is None and file.parent == mounted and "subPath" not in mount:
            key = file.name
        if key is not None:
            data = one(docs, "ConfigMap", volume["configMap"]["name"])["data"]
            assert key in data, f"ConfigMap {volume['configMap']['name']} has no key {key}"
            text: str = data[key]
            return text
    raise AssertionError(f"{path} is not a file of a mounted ConfigMap")


def endpoint_file(docs: tuple[Doc, ...]) -> Any:
    pod, container = main_container(docs, "scheduler")
    config = setting(container, "--config")
    assert config is not None
    return yaml.safe_load(configmap_file(docs, pod, container, config))
