"""The Kubernetes manifests run every container unprivileged and admit only what must
reach each port."""

from __future__ import annotations

import shutil
import sys
from typing import Any
from unittest import mock

import pytest

from tests.deploy import manifests as m
from tests.deploy.manifests import (
    IMAGE_UID,
    OVERLAYS,
    Doc,
)


def _effective(pod: Doc, container: Doc, key: str) -> Any:
    """A securityContext field as the kubelet applies it: the container's, else the pod's."""
    own = container.get("securityContext", {})
    return own[key] if key in own else pod["spec"].get("securityContext", {}).get(key)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_unprivileged_on_a_read_only_root(overlay: str) -> None:
    for pod, container in m.containers(m.render(overlay)):
        name = container["name"]
        own = container.get("securityContext", {})
        assert _effective(pod, container, "runAsNonRoot") is True, name
        assert _effective(pod, container, "runAsUser") == IMAGE_UID, name
        assert own.get("readOnlyRootFilesystem") is True, name
        assert own.get("allowPrivilegeEscalation") is False, name
        assert own.get("capabilities", {}).get("drop") == ["ALL"], name
        assert not own.get("capabilities", {}).get("add"), name
        assert _effective(pod, container, "seccompProfile") == {"type": "RuntimeDefault"}, name
        assert pod["spec"].get("automountServiceAccountToken") is False, name
        tmp = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
        assert tmp, f"{name}: no writable /tmp"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_there_is_one_scheduler_and_it_is_replaced_not_rolled(overlay: str) -> None:
    scheduler = m.one(m.render(overlay), "Deployment", "scheduler")
    assert scheduler["spec"]["replicas"] == 1
    assert scheduler["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize(("overlay", "least", "most"), [("dev", 2, 3), ("production", 3, 12)])
def test_dataplanes_scale_on_cpu_within_a_disruption_budget(
    overlay: str, least: int, most: int
) -> None:
    docs = m.render(overlay)
    dataplane = m.one(docs, "Deployment", "dataplane")
    assert "replicas" not in dataplane["spec"], "the HorizontalPodAutoscaler owns the count"
    hpa = m.one(docs, "HorizontalPodAutoscaler", "dataplane")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "dataplane",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (least, most)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    _, container = m.main_container(docs, "dataplane")
    assert container["resources"]["requests"]["cpu"], "CPU utilisation needs a CPU request"
    pdb = m.one(docs, "PodDisruptionBudget", "dataplane")
    assert pdb["spec"]["maxUnavailable"] == 1
    labels = dataplane["spec"]["template"]["metadata"]["labels"]
    assert m.selects(pdb["spec"]["selector"], labels)


def _covers(rule: Doc, port: int, pod: Doc) -> bool:
    """True if the ingress rule admits TCP to `port` of the pod."""
    if not rule.get("ports"):
        return True
    for entry in rule["ports"]:
        if entry.get("protocol", "TCP") != "TCP":
            continue
        if "port" not in entry:
            return True
        first = m.resolve(entry["port"], pod)
        if first is not None and first <= port <= entry.get("endPort", first):
            return True
    return False


def _ingress_rules(docs: tuple[Doc, ...], pod: Doc, port: int) -> list[Doc]:
    """The ingress rules that admit traffic to `port` of the pod; at least one policy must apply."""
    labels = pod["metadata"]["labels"]
    policies = [
        p for p in m.of_kind(docs, "NetworkPolicy") if m.selects(p["spec"]["podSelector"], labels)
    ]
    assert policies, f"no NetworkPolicy selects {labels}: every pod may reach port {port}"
    for policy in policies:
        assert "Ingress" in policy["spec"].get("policyTypes", ["Ingress"])
    return [
        rule
        for policy in policies
        for rule in policy["spec"].get("ingress", [])
        if _covers(rule, port, pod)
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_dataplane_pods_reach_the_schedulers_grpc_port(overlay: str) -> None:
    docs = m.render(overlay)
    scheduler = m.pod(docs, "scheduler")
    dataplane = m.pod(docs, "dataplane")["metadata"]["labels"]
    others = [
        w["spec"]["template"]["metadata"]["labels"]
        for w in m.workloads(docs)
        if w["metadata"]["name"] != "dataplane"
    ]
    rules = _ingress_rules(docs, scheduler, m.resolve("grpc", scheduler) or 0)
    assert rules, "dataplanes cannot reach the scheduler"
    for rule in rules:
        assert rule.get("from"), "a rule without `from` admits everyone"
        for peer in rule["from"]:
            assert peer.keys() == {"podSelector"}, (
                f"admits more than pods of this namespace: {peer}"
            )
            assert m.selects(peer["podSelector"], dataplane)
            assert not any(m.selects(peer["podSelector"], o) for o in others), peer


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_runtime_pods_reach_the_dataplanes(overlay: str) -> None:
    docs = m.render(overlay)
    dataplane = m.pod(docs, "dataplane")
    runtime = m.pod(docs, "runtime")["metadata"]["labels"]
    rules = _ingress_rules(docs, dataplane, m.resolve("http", dataplane) or 0)
    assert any(
        peer.keys() == {"podSelector"} and m.selects(peer["podSelector"], runtime)
        for rule in rules
        for peer in rule.get("from", [])
    )


def test_a_missing_tool_fails_with_how_to_install_it() -> None:
    with (
        mock.patch.object(sys, "executable", "/nonexistent/python"),
        mock.patch.object(shutil, "which", return_value=None),
        pytest.raises(pytest.fail.Exception, match=r"make install"),
    ):
        m.tool("kubectl")
