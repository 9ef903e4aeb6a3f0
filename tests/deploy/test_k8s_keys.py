"""Keys per caller in the Kubernetes manifests: the keys component (deploy/k8s/components/keys)
mounts the keys file Secret where `LUFTPAUSE_KEYS_FILE` points, in a way that lets an update
reach running pods, and gives the runtime a key the file lets act for others.

The dev overlay uses the component with Secrets it generates, so their content is checked too.
"""

from __future__ import annotations

import base64
from pathlib import PurePosixPath

import pytest
import yaml

from luftpause.common.auth import RUNTIME_KEY_ENV
from luftpause.common.keys import Keys, parse_keys
from tests.deploy import manifests as m
from tests.deploy.manifests import Doc


def secret_value(docs: tuple[Doc, ...], name: str, key: str) -> str:
    secret = m.one(docs, "Secret", name)
    assert key in secret["data"], f"Secret {name} has no key {key}"
    return base64.b64decode(secret["data"][key]).decode()


def keys_secret_file(docs: tuple[Doc, ...], service: str) -> tuple[str, str]:
    """The Secret and its key the service's keys file is, from a whole-volume mount."""
    pod, container = m.main_container(docs, service)
    path = m.setting(container, "--keys-file")
    assert path, f"{service}: no LUFTPAUSE_KEYS_FILE"
    file = PurePosixPath(path)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for mount in container.get("volumeMounts", []):
        if PurePosixPath(mount["mountPath"]) != file.parent:
            continue
        # A subPath mount is never updated in a running pod: the file could not be reloaded.
        assert "subPath" not in mount and mount.get("readOnly"), mount
        secret = volumes[mount["name"]]["secret"]
        assert "items" not in secret  # the key's own name is the file's
        return secret["secretName"], file.name
    raise AssertionError(f"{service}: {path} is not in a mounted volume")


def dev_keys() -> Keys:
    docs = m.render("dev")
    name, key = keys_secret_file(docs, "dataplane")
    return parse_keys(yaml.safe_load(secret_value(docs, name, key)))


@pytest.mark.parametrize("service", ["dataplane", "runtime"])
def test_dev_mounts_the_keys_secret_whole_where_the_keys_file_points(service: str) -> None:
    docs = m.render("dev")
    name, key = keys_secret_file(docs, service)
    assert (name, key) == ("luftpause-keys", "keys.yaml")
    assert len(parse_keys(yaml.safe_load(secret_value(docs, name, key)))) >= 2


def test_devs_runtime_key_is_a_key_of_the_file_that_acts_for_others() -> None:
    docs = m.render("dev")
    _, runtime = m.main_container(docs, "runtime")
    (var,) = [v for v in runtime["env"] if v["name"] == RUNTIME_KEY_ENV]
    ref = var["valueFrom"]["secretKeyRef"]
    entry = dev_keys().find(secret_value(docs, ref["name"], ref["key"]).encode())
    assert entry is not None and entry.acts_for


def test_devs_keys_are_documented_as_the_throwaways_they_are() -> None:
    """The dev file says how its keys read; each of those finds its entry."""
    keys = dev_keys()
    for entry in keys.entries:
        found = keys.find(f"dev-{entry.name}-key-not-secret".encode())
        assert found is entry


@pytest.mark.parametrize("overlay", m.OVERLAYS)
def test_the_dataplanes_and_the_runtime_read_the_same_keys_file_or_none(overlay: str) -> None:
    docs = m.render(overlay)
    services = ("dataplane", "runtime")
    uses = {m.setting(m.main_container(docs, s)[1], "--keys-file") for s in services}
    assert len(uses) == 1, f"{overlay}: different keys files {uses}"
