"""deploy/compose.yaml and its overlays agree with the images and the services; no engine needed.

Every image is one of ours, built from its Dockerfile and tagged with the package version;
every `LUFTPAUSE_*` variable is an option of the subcommand that image runs; the addresses
services give each other are the service names and the ports those services listen on; the
endpoint files parse and name the engines of the stack; the start order is health-gated; the
ports are published on loopback unless asked otherwise; and Compose itself (`config`, which
reads the files without a Docker engine) accepts the base file with each overlay.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from luftpause.common import envargs
from luftpause.common.auth import TOKEN_ENV
from luftpause.common.config import Config, parse_config
from tests.deploy import containers as c
from tests.deploy import manifests as m
from tests.deploy.containers import DOCKERFILES, ROOT, VERSION

DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "compose.yaml"
OVERLAYS = ("compose.llamacpp.yaml", "compose.hosted.yaml", "compose.ollama.yaml",
            "compose.otel.yaml", "compose.gpu.yaml", "compose.postgres.yaml")  # fmt: skip
# What the hosted overlay needs from the environment.
HOSTED_ENV = {
    "HOSTED_URL": "https://api.example.com",
    "HOSTED_MODEL": "some-model",
    "LUFTPAUSE_PG_PASSWORD": "not-a-secret",
}
IMAGE = re.compile(r"^luftpause/(?P<name>[a-z-]+):\$\{LUFTPAUSE_VERSION:-(?P<version>[^}]+)\}$")
PUBLISHED = re.compile(r"^\$\{LUFTPAUSE_PUBLISH_ADDR:-127\.0\.0\.1\}:\$\{[A-Z_]+:-\d+\}:(\d+)$")


@functools.cache
def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / name).read_text())
    return data


def merged(*names: str) -> dict[str, dict[str, Any]]:
    """The services as Compose merges the files: mappings key by key, volumes by target."""
    services: dict[str, dict[str, Any]] = {}
    for name in names:
        for service, spec in load(name)["services"].items():
            into = services.setdefault(service, {})
            for key, value in spec.items():
                if key == "environment":
                    into[key] = {**into.get(key, {}), **value}
                elif key == "volumes":
                    kept = {v.split(":")[1]: v for v in into.get(key, [])}
                    into[key] = list({**kept, **{v.split(":")[1]: v for v in value}}.values())
                else:
                    into[key] = value
    return services


def ours(spec: dict[str, Any]) -> str | None:
    """The luftpause image (= subcommand) a service runs; None for a third-party image."""
    found = IMAGE.match(spec["image"])
    return found["name"] if found else None


def mounted_config(spec: dict[str, Any]) -> Config:
    """The endpoint file a service reads: the repo file mounted where LUFTPAUSE_CONFIG points."""
    target = spec["environment"]["LUFTPAUSE_CONFIG"]
    for volume in spec.get("volumes", []):
        source, mount, *_ = volume.split(":")
        if mount == target:
            return parse_config(yaml.safe_load((DEPLOY / source).read_text()))
    raise AssertionError(f"nothing mounted at {target}")


@pytest.mark.parametrize("name", ("compose.yaml", *OVERLAYS))
def test_files_use_the_compose_spec_without_a_version_key(name: str) -> None:
    assert "version" not in load(name)


@pytest.mark.parametrize("name", ("compose.yaml", *OVERLAYS))
def test_every_luftpause_image_is_built_from_its_dockerfile_and_tagged_with_the_version(
    name: str,
) -> None:
    for service, spec in load(name)["services"].items():
        if "image" not in spec:
            continue  # an overlay's change to a service of the base file
        image = IMAGE.match(spec["image"])
        if image is None:
            assert not spec["image"].startswith("luftpause/"), spec["image"]
            continue
        assert image["version"] == VERSION, service
        build = spec["build"]
        assert (DEPLOY / build["context"]).resolve() == ROOT
        assert build["dockerfile"] == f"deploy/docker/{image['name']}.Dockerfile"
        assert (ROOT / build["dockerfile"]).is_file()
        assert build["args"] == {
            "BASE_IMAGE": "${BASE_IMAGE:-python:3.11-slim}",
            "CA_CERTS": "${CA_CERTS:-deploy/docker/ca}",
        }


def test_the_base_file_runs_the_services_two_simulated_engines_and_fake_mcp() -> None:
    services = load("compose.yaml")["services"]
    assert {s: ours(spec) for s, spec in services.items()} == {
        "scheduler": "scheduler",
        "dataplane": "dataplane",
        "runtime": "runtime",
        "fake-engine-a": "fake-engine",
        "fake-engine-b": "fake-engine",
        "fake-mcp": "fake-mcp",
    }
    for engine in ("fake-engine-a", "fake-engine-b"):
        assert services[engine]["environment"]["LUFTPAUSE_PROFILE"] == "gpu"


def test_the_start_order_waits_for_healthy_upstreams() -> None:
    services = load("compose.yaml")["services"]
    healthy = {"condition": "service_healthy"}
    assert services["dataplane"]["depends_on"] == {"scheduler": healthy}
    assert services["runtime"]["depends_on"] == {"dataplane": healthy, "fake-mcp": healthy}


def test_only_the_dataplane_runtime_and_status_page_are_published_on_loopback() -> None:
    published = {}
    for service, spec in load("compose.yaml")["services"].items():
        for port in spec.get("ports", []):
            found = PUBLISHED.match(port)
            assert found, f"{service}: {port} is not published on LUFTPAUSE_PUBLISH_ADDR"
            published[service] = int(found[1])
    assert published == {"dataplane": 8080, "runtime": 7000, "scheduler": 5001}


def test_the_token_reaches_the_dataplane_and_the_runtime_from_the_environment() -> None:
    services = load("compose.yaml")["services"]
    for service in ("dataplane", "runtime"):
        assert services[service]["environment"][TOKEN_ENV] == "${LUFTPAUSE_TOKEN:-}"


def test_the_runtime_journal_is_a_named_volume_at_its_state_dir() -> None:
    base = load("compose.yaml")
    runtime = base["services"]["runtime"]
    state_dir = runtime["environment"]["LUFTPAUSE_STATE_DIR"]
    assert f"journal:{state_dir}" in runtime["volumes"]
    assert "journal" in base["volumes"]


@pytest.mark.parametrize("overlay", (None, *OVERLAYS))
def test_every_luftpause_variable_is_an_option_of_the_service_that_reads_it(
    overlay: str | None,
) -> None:
    files = ("compose.yaml",) if overlay is None else ("compose.yaml", overlay)
    for service, spec in merged(*files).items():
        subcommand = ours(spec)
        if subcommand is None:
            continue
        known = set(m.options(subcommand)) | {TOKEN_ENV}
        for variable in spec.get("environment", {}):
            if variable.startswith(envargs.PREFIX):
                assert variable in known, f"{service}: {variable}"


@pytest.mark.parametrize("overlay", (None, "compose.llamacpp.yaml", "compose.otel.yaml"))
def test_services_find_each_other_by_name_on_the_ports_they_listen_on(
    overlay: str | None,
) -> None:
    files = ("compose.yaml",) if overlay is None else ("compose.yaml", overlay)
    services = merged(*files)

    def listens(service: str) -> int:
        subcommand = ours(services[service])
        assert subcommand is not None, service
        variable = envargs.env_name(m.PORT_OPTIONS[subcommand]["http"])
        given = services[service].get("environment", {}).get(variable)
        return int(given or m.options(subcommand)[variable])

    def check(url: str) -> None:
        parts = urlsplit(url if "://" in url else f"grpc://{url}")
        assert parts.hostname in services, url
        if parts.hostname == "scheduler":
            assert parts.port == int(m.options("scheduler")["LUFTPAUSE_GRPC_PORT"])
        else:
            assert parts.port == listens(parts.hostname), url

    check(services["dataplane"]["environment"]["LUFTPAUSE_SCHEDULER"])
    check(services["runtime"]["environment"]["LUFTPAUSE_DATAPLANE"])
    check(services["runtime"]["environment"]["LUFTPAUSE_MCP_SERVER"])
    config = mounted_config(services["scheduler"])
    assert mounted_config(services["dataplane"]) == config
    for endpoint in config.endpoints:
        check(endpoint.url)
    models = config.generative_models()
    assert services["runtime"]["environment"]["LUFTPAUSE_MODEL"] in models


@pytest.mark.parametrize("overlay", ("compose.hosted.yaml", "compose.ollama.yaml"))
def test_an_overlay_that_writes_its_endpoint_file_writes_a_valid_one(overlay: str) -> None:
    services = merged("compose.yaml", overlay)
    for service in ("scheduler", "dataplane"):
        spec = services[service]
        entrypoint = spec["entrypoint"]
        assert entrypoint[:2] == ["/bin/sh", "-c"]
        target = spec["environment"]["LUFTPAUSE_CONFIG"]
        assert f'"$$ENDPOINTS_YAML" > {target} && exec luftpause-{service}' in entrypoint[2]
        text = interpolate(spec["environment"]["ENDPOINTS_YAML"], HOSTED_ENV)
        config = parse_config(yaml.safe_load(text))
        assert len(config.endpoints) == 1 and not config.endpoints[0].metrics
        key = config.endpoints[0].api_key_env
        assert not key or key in spec["environment"]


def interpolate(text: str, environ: dict[str, str]) -> str:
    """Compose's `${VAR:-default}` and `${VAR:?error}` for the tests' environment."""

    def one(found: re.Match[str]) -> str:
        name, how, default = found["name"], found["how"], found["default"] or ""
        if name in environ:
            return environ[name]
        assert how != ":?", f"{name} is required"
        return default

    return re.sub(r"\$\{(?P<name>\w+)(?:(?P<how>:-|:\?)(?P<default>[^}]*))?\}", one, text)


def compose_config(files: tuple[str, ...], environ: dict[str, str]) -> str:
    try:
        cli = c.compose_cli()
    except c.DockerUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    args = [*cli, "--project-directory", str(DEPLOY)]
    for name in files:
        args += ["-f", str(DEPLOY / name)]
    clean = {"COMPOSE_PROJECT_NAME": "luftpause-config-check", **environ}
    done = c.run([*args, "config"], timeout=60, env=clean, check=False, cwd=Path("/"))
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("overlay", (None, *OVERLAYS))
def test_compose_accepts_the_base_file_with_each_overlay(overlay: str | None) -> None:
    files = ("compose.yaml",) if overlay is None else ("compose.yaml", overlay)
    rendered = yaml.safe_load(compose_config(files, HOSTED_ENV))
    assert set(merged(*files)) == set(rendered["services"])
    for spec in rendered["services"].values():
        assert not spec["image"].startswith("luftpause/") or spec["image"].endswith(f":{VERSION}")


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


# The GPU overlay's engines: the official image each runs, the flag naming its model, and the
# flags luftpause relies on (load and KV in /metrics, prefix caching, priority lower first).
GPU_ENGINES = {
    "vllm": (
        "vllm/vllm-openai:",
        "--model",
        {"--enable-prefix-caching", "--enable-prompt-tokens-details", "--enable-auto-tool-choice"},
    ),
    "sglang": (
        "lmsysorg/sglang:",
        "--model-path",
        {
            "--enable-metrics",
            "--enable-priority-scheduling",
            "--schedule-low-priority-values-first",
        },
    ),
}


def test_the_gpu_overlay_points_luftpause_at_its_official_vllm_and_sglang_replicas() -> None:
    services = merged("compose.yaml", "compose.gpu.yaml")
    text = interpolate(services["scheduler"]["environment"]["ENDPOINTS_YAML"], {})
    assert (
        services["dataplane"]["environment"]["ENDPOINTS_YAML"]
        == (services["scheduler"]["environment"]["ENDPOINTS_YAML"])
    )
    config = parse_config(yaml.safe_load(text))
    model = interpolate(services["runtime"]["environment"]["LUFTPAUSE_MODEL"], {})
    assert {e.id for e in config.endpoints} == set(GPU_ENGINES)
    for endpoint in config.endpoints:
        image, model_flag, flags = GPU_ENGINES[endpoint.id]
        spec = services[endpoint.id]
        args = [interpolate(str(arg), {}) for arg in spec["command"]]
        assert interpolate(spec["image"], {}).startswith(image)
        assert urlsplit(endpoint.url).hostname == endpoint.id
        assert urlsplit(endpoint.url).port == int(_flag(args, "--port"))
        assert endpoint.models == frozenset({model}) and _flag(args, model_flag) == model
        assert endpoint.metrics == "/metrics" and flags <= set(args)
        assert endpoint.priority is not None
        assert endpoint.priority.interactive < endpoint.priority.batch
        [gpu] = spec["deploy"]["resources"]["reservations"]["devices"]
        assert gpu["capabilities"] == ["gpu"]
    assert _flag(services["vllm"]["command"], "--scheduling-policy") == "priority"


def test_the_gpu_overlay_serves_the_model_the_environment_names_everywhere() -> None:
    rendered = yaml.safe_load(
        compose_config(("compose.yaml", "compose.gpu.yaml"), {"GPU_MODEL": "org/some-model"})
    )
    services = rendered["services"]
    assert services["runtime"]["environment"]["LUFTPAUSE_MODEL"] == "org/some-model"
    config = parse_config(yaml.safe_load(services["scheduler"]["environment"]["ENDPOINTS_YAML"]))
    assert all(e.models == frozenset({"org/some-model"}) for e in config.endpoints)
    for name, (_, model_flag, _) in GPU_ENGINES.items():
        assert _flag(services[name]["command"], model_flag) == "org/some-model"


def test_the_hosted_overlay_refuses_to_start_without_its_url() -> None:
    try:
        cli = c.compose_cli()
    except c.DockerUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    files = ["-f", str(BASE), "-f", str(DEPLOY / "compose.hosted.yaml")]
    done = c.run([*cli, *files, "config"], timeout=60, check=False, env={"HOSTED_URL": ""})
    assert done.returncode != 0 and "HOSTED_URL" in done.stderr


def test_the_dockerfiles_named_by_compose_exist_for_every_image_make_builds() -> None:
    named = {
        found["name"]
        for name in ("compose.yaml", *OVERLAYS)
        for spec in load(name)["services"].values()
        if "image" in spec and (found := IMAGE.match(spec["image"]))
    }
    assert named == set(c.ALL_IMAGES)
    assert {p.name.removesuffix(".Dockerfile") for p in DOCKERFILES.glob("*.Dockerfile")} == named
