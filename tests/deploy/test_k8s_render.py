"""The Kubernetes manifests render with kustomize and pass offline validation."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy import manifests as m
from tests.deploy.manifests import (
    K8S,
    K8S_VERSIONS,
    NAMESPACES,
    OVERLAYS,
)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_passes_strict_offline_validation(
    overlay: str, version: str, tmp_path: Path
) -> None:
    rendered = tmp_path / f"{overlay}.yaml"
    rendered.write_text(yaml.safe_dump_all(m.render(overlay)))
    validate = m.tool("kubernetes-validate")
    done = subprocess.run(
        [validate, "--strict", "--kubernetes-version", version, "--quiet", str(rendered)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_puts_everything_in_its_own_namespace(overlay: str) -> None:
    docs = m.render(overlay)
    namespace = NAMESPACES[overlay]
    assert [d["metadata"]["name"] for d in m.of_kind(docs, "Namespace")] == [namespace]
    stray = [
        f"{d['kind']}/{d['metadata']['name']}"
        for d in docs
        if d["kind"] != "Namespace" and d["metadata"].get("namespace") != namespace
    ]
    assert not stray


def test_base_leaves_the_namespace_to_the_overlays() -> None:
    base = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    assert "namespace" not in base
    for path in (K8S / "base").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and "metadata" in doc:
                assert "namespace" not in doc["metadata"], path.name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_resource_carries_the_common_labels(overlay: str) -> None:
    for doc in m.render(overlay):
        if doc["kind"] == "Namespace":
            continue
        labels = doc["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "luftpause", doc["metadata"]["name"]
        assert "app.kubernetes.io/name" in labels, doc["metadata"]["name"]
    for workload in m.workloads(m.render(overlay)):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert {"app.kubernetes.io/name", "app.kubernetes.io/component"} <= labels.keys()
