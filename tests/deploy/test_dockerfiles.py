"""The Dockerfiles of deploy/docker/ pass hadolint and agree with the services; no Docker needed.

Each image runs its own distribution's command (`luftpause-<image>`, the `main` of the `luftpause`
subcommand of that name) as uid 10001, from a base image given as a build argument, with a health
check against its own port, the ports its service listens on by default exposed, and only the
variables its subcommand reads. Each installs only its own distribution and those it depends on,
each distribution's dependencies in a layer written alike in every image, so images share the
layers of what they share.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from luftpause import cli
from luftpause.common import envargs
from tests import distributions
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
def test_each_image_runs_its_own_command_as_uid_10001(name: str) -> None:
    stage = d.final_stage(name)
    assert name in cli.SUBCOMMANDS
    command = f"luftpause-{name}"
    assert d.exec_form(d.one(stage, "ENTRYPOINT")) == [command]
    # The command comes with a distribution the image installs (it runs what `luftpause <name>`
    # runs: tests/test_layout.py).
    assert distributions.with_script(command) in d.installed(name)
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


def test_every_image_shares_the_base_stage_and_the_start_of_its_venv() -> None:
    shared = {name: d.shared_text(name, d.DEPENDENCY_MARK) for name in d.ALL_IMAGES}
    assert len(set(shared.values())) == 1, "the Dockerfiles differ above their dependency layers"


@pytest.mark.parametrize("name", d.ALL_IMAGES)
def test_each_image_installs_its_distribution_and_only_what_that_one_depends_on(
    name: str,
) -> None:
    own = distributions.with_script(f"luftpause-{name}")
    needed = distributions.closure(own.name)
    assert d.installed(name) == needed
    assert d.wheels(name) == [f"/tmp/dist/{dist.wheel}*.whl" for dist in needed]
    # Only its own wheels enter the image: a change to another distribution leaves it cached.
    assert d.copied_wheels(name) == [f"dist/{dist.wheel}*.whl" for dist in needed]


def test_the_runtime_image_installs_no_grpc_code_and_the_dataplane_no_mcp_sdk() -> None:
    assert "luftpause-rpc" not in {dist.name for dist in d.installed("runtime")}
    for dist in d.installed("dataplane"):
        assert "mcp" not in dist.requires_names, dist.name


def test_a_distributions_dependency_layer_is_written_alike_in_every_image() -> None:
    """So an image reuses the layers it shares with one built before it (the order of
    distributions.FOLDERS, in which every image installs them, keeps shared ones in front)."""
    layers: dict[str, set[tuple[d.Instruction, d.Instruction]]] = {}
    for name in d.ALL_IMAGES:
        for dist, layer in d.dependency_layers(name).items():
            layers.setdefault(dist, set()).add(layer)
    assert {dist: len(found) for dist, found in layers.items() if len(found) > 1} == {}
    for dist, [(copy, run)] in layers.items():
        folder = distributions.distributions()[dist].folder.relative_to(ROOT)
        source, target = copy[1].split()
        assert (source, run[0]) == (f"{folder}/pyproject.toml", "RUN"), dist
        assert f"requirements.py {target}pyproject.toml > " in run[1], dist
        assert "pip install --no-cache-dir -r " in run[1], dist


def test_the_test_kit_images_share_one_venv_stage() -> None:
    venv = d.shared_text("fake-engine", "\nFROM base\n")
    assert d.shared_text("fake-mcp", "\nFROM base\n") == venv
    # The engine image adds its stage after the shared venv stage.
    assert d.shared_text("llama-engine", "\n# The engine and the model") == venv


def test_the_service_images_final_stages_differ_only_in_their_own_part() -> None:
    finals = {name: d.final_text(name, d.SERVICE_MARK) for name in d.STACK_IMAGES}
    assert len(set(finals.values())) == 1, "the final stages differ above their own part"


def test_the_requirements_script_reads_each_distributions_third_party_dependencies() -> None:
    for dist in distributions.distributions().values():
        done = subprocess.run(
            [sys.executable, str(d.REQUIREMENTS), str(dist.folder / "pyproject.toml")],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        own = set(distributions.distributions())
        expected = [r for r in dist.requires if distributions.requirement_name(r) not in own]
        assert [line for line in done.stdout.splitlines() if line] == expected, dist.name


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
    pyprojects = {
        str((dist.folder / "pyproject.toml").relative_to(ROOT))
        for dist in distributions.distributions().values()
    }
    requirements = str(d.REQUIREMENTS.relative_to(ROOT))
    assert allowed == {*pyprojects, requirements, "dist/", "deploy/docker/ca/"}
    ca_default = "deploy/docker/ca"
    copied: set[str] = set()
    for name in d.ALL_IMAGES:
        for key, args in d.instructions(name):
            if key == "COPY" and not args.startswith("--from"):
                for written in args.split()[:-1]:
                    # A wheel of dist/ (`dist/luftpause_common-*.whl`) counts as dist/.
                    source = re.sub(r"^dist/[^/]+\.whl$", "dist/", written)
                    source = source.replace("${CA_CERTS}", ca_default)
                    assert source in allowed, f"{name}: COPY {source} is outside the build context"
                    copied.add(source)
            if key == "ARG" and args.startswith("CA_CERTS="):
                assert args == f"CA_CERTS={ca_default}"
    assert (ROOT / ca_default / "README.md").is_file()
    assert copied == allowed, "let into the build context, never copied"
