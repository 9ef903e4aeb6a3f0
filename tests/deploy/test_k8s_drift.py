"""The Kubernetes manifests agree with the code: variables, ports, probes and paths."""

from __future__ import annotations

import importlib
import tomllib
from urllib.parse import urlsplit

import pytest
import yaml

from luftpause import cli
from luftpause.common import envargs
from luftpause.common.auth import RUNTIME_KEY_ENV, TOKEN_ENV
from luftpause.common.config import parse_config
from luftpause.rpc import scheduler_pb2
from tests.deploy import manifests as m
from tests.deploy.manifests import (
    IMAGE_UID,
    K8S,
    OPEN_PATHS_MODULE,
    OVERLAYS,
    PORT_OPTIONS,
    ROOT,
    Doc,
)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_image_runs_a_luftpause_subcommand(overlay: str) -> None:
    for _, container in m.containers(m.render(overlay)):
        assert m.service_of(container) in cli.SUBCOMMANDS, container["image"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_luftpause_variable_is_an_option_of_the_service_that_reads_it(
    overlay: str,
) -> None:
    unknown = []
    for _, container in m.containers(m.render(overlay)):
        service = m.service_of(container)
        # The token and the runtime's key are read from the environment only, never a flag.
        known = set(m.options(service)) | ({TOKEN_ENV} if service in OPEN_PATHS_MODULE else set())
        known |= {RUNTIME_KEY_ENV} if service == "runtime" else set()
        for var in container.get("env", []):
            if var["name"].startswith(envargs.PREFIX) and var["name"] not in known:
                unknown.append(f"{service}: {var['name']}")
    assert not unknown, f"not an option of that service: {unknown}"


# Per subcommand: the module whose `parse_args(argv, environ)` gives its config, and the option
# behind each attribute of that config.
CONFIG_OF = {
    "scheduler": (
        "luftpause.scheduler.main",
        {
            "host": "--host",
            "grpc_port": "--grpc-port",
            "http_port": "--http-port",
            "config": "--config",
        },
    ),
    "dataplane": (
        "luftpause.dataplane.main",
        {"host": "--host", "port": "--port", "scheduler": "--scheduler", "config": "--config"},
    ),
    "runtime": (
        "luftpause.runtime.main",
        {
            "host": "--host",
            "port": "--port",
            "dataplane": "--dataplane",
            "state_dir": "--state-dir",
            "model": "--model",
        },
    ),
    "fake-engine": (
        "luftpause.testkit.engine.main",
        {"host": "--host", "port": "--port", "replica_id": "--id", "profile": "--profile"},
    ),
    "fake-mcp": ("luftpause.testkit.fakemcp.server", {"host": "--host", "port": "--port"}),
}


STAND_INS = {"LUFTPAUSE_JOURNAL": "postgresql://stand-in@database/luftpause"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_service_reads_its_containers_environment_as_the_manifest_means(
    overlay: str,
) -> None:
    for _, container in m.containers(m.render(overlay)):
        service = m.service_of(container)
        module, attributes = CONFIG_OF[service]
        # Variables from Secrets and the downward API get a stand-in value (of the right form).
        environ = {
            v["name"]: v.get("value", STAND_INS.get(v["name"], f"<{v['name']}>"))
            for v in container.get("env", [])
        }
        config = importlib.import_module(module).parse_args([], environ)
        for attribute, option in attributes.items():
            assert str(getattr(config, attribute)) == m.setting(container, option), (
                f"{service}: {option}"
            )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_listens_on_all_interfaces_on_its_declared_ports(overlay: str) -> None:
    for _, container in m.containers(m.render(overlay)):
        service = m.service_of(container)
        assert m.setting(container, "--host") == "0.0.0.0", service
        declared = m.ports(container)
        assert declared.keys() == PORT_OPTIONS[service].keys(), service
        for name, option in PORT_OPTIONS[service].items():
            assert str(declared[name]) == m.setting(container, option), f"{service} {name}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scheduler_probes_are_the_grpc_health_services_it_serves(overlay: str) -> None:
    _, container = m.main_container(m.render(overlay), "scheduler")
    grpc_port = m.ports(container)["grpc"]
    service_name = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
    assert container["readinessProbe"]["grpc"] == {"port": grpc_port, "service": service_name}
    # No service name: the server's overall health, SERVING as soon as it has started.
    assert container["livenessProbe"]["grpc"] == {"port": grpc_port}
    assert container["startupProbe"]["grpc"] == {"port": grpc_port}


@pytest.mark.parametrize("service", ["dataplane", "runtime"])
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_http_probes_are_ready_and_health_on_the_service_port(overlay: str, service: str) -> None:
    pod, container = m.main_container(m.render(overlay), service)
    port = int(m.setting(container, "--port") or 0)
    expected = {"readinessProbe": "/ready", "livenessProbe": "/health", "startupProbe": "/health"}
    for probe, path in expected.items():
        http = container[probe]["httpGet"]
        assert http["path"] == path, f"{service} {probe}"
        assert m.resolve(http["port"], pod) == port, f"{service} {probe}"


@pytest.mark.parametrize("service", sorted(OPEN_PATHS_MODULE))
def test_probe_and_scrape_paths_need_no_token(service: str) -> None:
    """With LUFTPAUSE_TOKEN set, the kubelet and Prometheus send none: their paths must be open."""
    open_paths = importlib.import_module(OPEN_PATHS_MODULE[service]).OPEN_PATHS
    for overlay in OVERLAYS:
        pod, container = m.main_container(m.render(overlay), service)
        paths = {container[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe")}
        if pod["metadata"].get("annotations", {}).get("prometheus.io/scrape") == "true":
            paths.add(pod["metadata"]["annotations"]["prometheus.io/path"])
        assert paths <= open_paths, f"{service} answers {paths - open_paths} only with the token"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scrape_annotations_point_at_the_metrics_port(overlay: str) -> None:
    docs = m.render(overlay)
    for service, port_name in (("scheduler", "http"), ("dataplane", "http")):
        pod, container = m.main_container(docs, service)
        annotations = pod["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/path"] == "/metrics"
        assert annotations["prometheus.io/port"] == str(m.ports(container)[port_name])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_port_reaches_a_container_port(overlay: str) -> None:
    docs = m.render(overlay)
    pods = [w["spec"]["template"] for w in m.workloads(docs)]
    for svc in m.of_kind(docs, "Service"):
        selector = svc["spec"]["selector"]
        chosen = [p for p in pods if m.selects({"matchLabels": selector}, p["metadata"]["labels"])]
        assert len(chosen) == 1, f"Service {svc['metadata']['name']} selects {len(chosen)} pods"
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert m.resolve(target, chosen[0]) is not None, svc["metadata"]["name"]


def _service_port(docs: tuple[Doc, ...], host: str, port: int) -> tuple[Doc, int]:
    """The pod behind `host:port` (a Service of the render) and the container port it reaches."""
    svc = m.one(docs, "Service", host.split(".")[0])
    (entry,) = [p for p in svc["spec"]["ports"] if p["port"] == port]
    pods = [w["spec"]["template"] for w in m.workloads(docs)]
    (pod,) = [
        p
        for p in pods
        if m.selects({"matchLabels": svc["spec"]["selector"]}, p["metadata"]["labels"])
    ]
    target = m.resolve(entry.get("targetPort", port), pod)
    assert target is not None
    return pod, target


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_upstream_addresses_name_the_services_in_front_of_the_right_ports(overlay: str) -> None:
    docs = m.render(overlay)
    _, dataplane = m.main_container(docs, "dataplane")
    host, _, port = (m.setting(dataplane, "--scheduler") or "").rpartition(":")
    pod, target = _service_port(docs, host, int(port))
    assert pod is m.pod(docs, "scheduler")
    assert target == m.ports(m.main_container(docs, "scheduler")[1])["grpc"]

    _, runtime = m.main_container(docs, "runtime")
    url = urlsplit(m.setting(runtime, "--dataplane") or "")
    assert url.scheme == "http" and url.hostname and url.port
    pod, target = _service_port(docs, url.hostname, url.port)
    assert pod is m.pod(docs, "dataplane")
    assert target == m.ports(dataplane)["http"]


def test_dev_pool_and_tools_are_the_fake_services_of_the_overlay() -> None:
    docs = m.render("dev")
    config = parse_config(m.endpoint_file(docs))
    assert len(config.endpoints) == 2
    for endpoint in config.endpoints:
        url = urlsplit(endpoint.url)
        assert url.hostname and url.port
        pod, target = _service_port(docs, url.hostname, url.port)
        (container,) = pod["spec"]["containers"]
        assert m.service_of(container) == "fake-engine"
        assert m.ports(container)["http"] == target
        assert m.setting(container, "--id") == endpoint.id
        assert m.setting(container, "--profile") == "gpu"
    _, runtime = m.main_container(docs, "runtime")
    url = urlsplit(m.setting(runtime, "--mcp-server") or "")
    assert url.hostname and url.port and url.path == "/mcp"
    pod, target = _service_port(docs, url.hostname, url.port)
    (container,) = pod["spec"]["containers"]
    assert m.service_of(container) == "fake-mcp" and m.ports(container)["http"] == target


@pytest.mark.parametrize("service", ["scheduler", "dataplane"])
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_endpoint_file_is_mounted_where_luftpause_config_points_and_parses(
    overlay: str, service: str
) -> None:
    docs = m.render(overlay)
    pod, container = m.main_container(docs, service)
    path = m.setting(container, "--config")
    assert path == "/etc/luftpause/endpoints.yaml"
    config = parse_config(yaml.safe_load(m.configmap_file(docs, pod, container, path)))
    assert config.endpoints


@pytest.mark.parametrize("service", ["scheduler", "dataplane"])
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_engine_key_variable_reaches_the_services_that_send_it(
    overlay: str, service: str
) -> None:
    docs = m.render(overlay)
    config = parse_config(m.endpoint_file(docs))
    _, container = m.main_container(docs, service)
    names = {var["name"] for var in container.get("env", [])}
    from_secrets = [e for e in container.get("envFrom", []) if "secretRef" in e]
    for endpoint in config.endpoints:
        if endpoint.api_key_env:
            assert endpoint.api_key_env in names or from_secrets, endpoint.id


@pytest.mark.parametrize("overlay", m.FILE_JOURNAL)
def test_journal_lives_on_the_runtimes_claimed_volume(overlay: str) -> None:
    docs = m.render(overlay)
    runtime = m.one(docs, "StatefulSet", "runtime")
    pod, container = m.main_container(docs, "runtime")
    state_dir = m.setting(container, "--state-dir")
    (claim,) = runtime["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts.get(state_dir) == claim["metadata"]["name"]
    assert pod["spec"]["securityContext"]["fsGroup"] == IMAGE_UID


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_pinned_to_the_package_version(overlay: str) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for _, container in m.containers(m.render(overlay)):
        assert container["image"].endswith(f":{version}"), container["image"]


def test_production_pins_its_own_image_tags() -> None:
    """A new release in the base does not move production until its overlay says so."""
    kustomization = K8S / "overlays" / "production" / "kustomization.yaml"
    pinned = {
        image["name"]
        for image in yaml.safe_load(kustomization.read_text()).get("images", [])
        if image.get("newTag") or image.get("digest")
    }
    used = {c["image"].partition(":")[0] for _, c in m.containers(m.render("production"))}
    assert used <= pinned
