"""The Dockerfiles of deploy/docker/ pass hadolint and agree with the services; no Docker needed.

Each image runs one `luftpause` subcommand as uid 10001, from a base image given as a build
argument, with a health check against its own port, the ports its service listens on by default
exposed, and only the variables its subcommand reads. The service images share every
instruction before their own few, so one venv layer serves all of them.
"""

from __future__ import annotations

import subprocess

import pytest

from luftpause import cli
from luftpause.common import envargs
from tests.deploy import dockerfiles as d
from tests.deploy import manifests as m
from tests.deploy.containers import ROOT
from tests.deploy.manifests import IMAGE_UID, PORT_OPTIONS

# Per image: the option whose port its health check asks, and the path it asks.
HEALTH = {
    "scheduler": ("--http-port", "/ready"),
    "dataplane": ("--port", "/ready"),
    "runtime": ("--port", "/ready"),
    "fake-engine": ("--port", "/health"),
    "fake-mcp": ("--port", "/health"),
    "llama-engine": ("--port", "/health"),
}
JOURNAL = "/var/lib/luftpause"


@pytest.mark.parametrize("name", d.ALL_IMAGES)
def test_hadolint_passes(name: str) -> None:
    done = subprocess.run(
        [m.tool("hadolint"), str(d.path(name))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", d.ALL_IMAGES)
def test_the_base_image_is_a_build_argument_defaulting_to_the_official_slim_image(
    name: str,
) -> None:
    found = d.instructions(name)
    assert found[0] == ("ARG", "BASE_IMAGE=python:3.11-slim")
    stages = [args.split()[-1] for key, args in found if key == "FROM" and " AS " in args]
    for key, args in found:
        if key == "FROM":
            image = args.split()[0]
            assert image == "${BASE_IMAGE}" or image in stages, args


@pytest.mark.parametrize("name", d.ALL_IMAGES)
def test_each_image_runs_its_luftpause_subcommand_as_uid_10001(name: str) -> None:
    stage = d.final_stage(name)
    assert name in cli.SUBCOMMANDS
    assert d.exec_form(d.one(stage, "ENTRYPOINT")) == ["luftpause", name]
    assert [int(i) for i in d.one(stage, "USER").split(":")] in ([IMAGE_UID], [IMAGE_UID] * 2)
    # Nothing after USER runs as root again.
    assert [key for key, _ in stage].index("USER") > max(
        i for i, (key, _) in enumerate(stage) if key == "RUN" or key == "COPY"
    )


@pytest.mark.parametrize("name", d.ALL_IMAGES)
def test_each_image_exposes_the_ports_its_service_listens_on_by_default(name: str) -> None:
    defaults = m.options(name)
    ports = {int(defaults[envargs.env_name(o)]) for o in PORT_OPTIONS[name].values()}
    assert {int(p) for p in d.one(d.final_stage(name), "EXPOSE").split()} == ports


@pytest.mark.parametrize("name", d.ALL_IMAGES)
def test_each_health_check_asks_its_service_on_the_port_it_listens_on(name: str) -> None:
    option, route = HEALTH[name]
    variable = envargs.env_name(option)
    default = m.options(name)[variable]
    python, flag, code = d.healthcheck_command(d.final_stage(name))
    assert (python, flag) == ("python3", "-c")  # no curl in the slim image
    assert "urllib.request.urlopen(" in code
    assert f"os.environ.get('{variable}', '{default}') + '{route}'" in code


@pytest.mark.parametrize("name", d.ALL_IMAGES)
def test_each_image_listens_on_every_interface_and_sets_only_its_own_options(name: str) -> None:
    variables = d.env(d.final_stage(name))
    assert variables["LUFTPAUSE_HOST"] == "0.0.0.0"
    known = m.options(name)
    assert {v for v in variables if v.startswith(envargs.PREFIX)} <= set(known)


def test_the_runtime_keeps_its_journal_on_a_volume_owned_by_the_image_user() -> None:
    stage = d.final_stage("runtime")
    assert d.one(stage, "VOLUME") == JOURNAL
    assert d.env(stage)["LUFTPAUSE_STATE_DIR"] == JOURNAL
    assert f"chown {IMAGE_UID}:{IMAGE_UID} {JOURNAL}" in d.one(stage, "RUN")


def test_the_service_images_share_every_instruction_before_their_own() -> None:
    shared = {name: d.shared_text(name, d.SERVICE_MARK) for name in d.STACK_IMAGES}
    assert len(set(shared.values())) == 1, "the service Dockerfiles differ above their own part"
    # The engine image adds its stage after the shared venv stage.
    venv = d.shared_text("scheduler", "\nFROM base\n")
    assert d.shared_text("llama-engine", "\n# The engine and the model") == venv


@pytest.mark.parametrize("name", d.ALL_IMAGES)
def test_no_image_installs_the_dev_extra(name: str) -> None:
    runs = " ".join(args for key, args in d.instructions(name) if key == "RUN")
    assert "[dev" not in runs and "'dev'" not in runs


def test_the_build_context_lets_in_only_what_the_images_copy() -> None:
    patterns = [
        line
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert patterns[0] == "*"
    allowed = {p.removeprefix("!") for p in patterns[1:]}
    assert allowed == {"pyproject.toml", "dist/", "deploy/docker/ca/"}
    ca_default = "deploy/docker/ca"
    for name in d.ALL_IMAGES:
        for key, args in d.instructions(name):
            if key == "COPY" and not args.startswith("--from"):
                source = args.split()[0].replace("${CA_CERTS}", ca_default)
                assert source in allowed, f"{name}: COPY {source} is outside the build context"
            if key == "ARG" and args.startswith("CA_CERTS="):
                assert args == f"CA_CERTS={ca_default}"
    assert (ROOT / ca_default / "README.md").is_file()
