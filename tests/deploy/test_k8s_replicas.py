"""The runtime on a PostgreSQL journal in Kubernetes (components/postgres-journal, overlay
production-postgres): a Deployment of replicas with the database URL from a Secret, in place of
the StatefulSet of one with its journal on a volume; ready only while the database answers."""

from __future__ import annotations

from tests.deploy import manifests as m

OVERLAY = "production-postgres"


def env_of(container: m.Doc) -> dict[str, m.Doc]:
    return {v["name"]: v for v in container.get("env", [])}


def test_the_runtime_is_a_deployment_of_replicas_and_the_statefulset_is_gone() -> None:
    docs = m.render(OVERLAY)
    assert not [d for d in m.workloads(docs) if d["kind"] == "StatefulSet"]
    assert "runtime-headless" not in {d["metadata"]["name"] for d in m.of_kind(docs, "Service")}
    runtime = m.one(docs, "Deployment", "runtime")
    assert runtime["spec"]["replicas"] >= 2
    pod, container = m.main_container(docs, "runtime")
    assert env_of(container)["LUFTPAUSE_MODEL"]["value"] == "llama-3.2-1b"  # production's
    claims = [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert not claims  # the journal is the database's; the state dir holds attention only


def test_the_database_url_comes_from_a_secret_and_each_pod_is_its_own_replica() -> None:
    _, container = m.main_container(m.render(OVERLAY), "runtime")
    env = env_of(container)
    assert env["LUFTPAUSE_JOURNAL"]["valueFrom"]["secretKeyRef"] == {
        "name": "luftpause-journal",
        "key": "url",
    }
    assert env["LUFTPAUSE_REPLICA"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert float(env["LUFTPAUSE_LEASE_SECONDS"]["value"]) > 0


def test_readiness_is_the_runtimes_ready_route_which_asks_the_database() -> None:
    _, container = m.main_container(m.render(OVERLAY), "runtime")
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"


def test_the_runtime_service_and_budget_select_the_deployments_pods() -> None:
    docs = m.render(OVERLAY)
    labels = m.one(docs, "Deployment", "runtime")["spec"]["template"]["metadata"]["labels"]
    service = m.one(docs, "Service", "runtime")
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    budget = m.one(docs, "PodDisruptionBudget", "runtime")
    assert m.selects(budget["spec"]["selector"], labels)
    assert budget["spec"]["maxUnavailable"] == 1


def test_the_stop_grace_fits_in_the_pods_termination_grace() -> None:
    docs = m.render(OVERLAY)
    pod, container = m.main_container(docs, "runtime")
    grace = float(m.setting(container, "--stop-grace") or 5.0)
    assert pod["spec"]["terminationGracePeriodSeconds"] > grace + 2
