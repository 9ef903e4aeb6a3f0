"""The Makefile's image targets, read without building: `make -n` and `release DRY_RUN=1`."""

from __future__ import annotations

import re
import shutil
import subprocess

from tests.deploy.containers import ALL_IMAGES, DOCKERFILES, ROOT, VERSION


def make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [shutil.which("make") or "make", "--no-print-directory", "-s", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


def test_images_builds_every_image_with_the_base_image_and_ca_arguments() -> None:
    done = make("-n", "images", "BASE_IMAGE=my/base:1", "CA_CERTS=/my/certs", "DOCKER=docker")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"for name in {' '.join(ALL_IMAGES)}; do" in out
    assert "--build-arg BASE_IMAGE=my/base:1 --build-arg CA_CERTS=dist/ca" in out
    assert f"-t luftpause/$name:{VERSION} -t luftpause/$name:latest ." in out
    assert "/my/certs/*.crt" in out
    for name in ALL_IMAGES:
        assert (DOCKERFILES / f"{name}.Dockerfile").is_file()


def test_release_dry_run_prints_the_tag_and_push_of_every_image_and_builds_nothing() -> None:
    done = make("release", "REGISTRY=registry.example.com/team", "DRY_RUN=1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    program, rest = lines[0].split(" ", 1)
    assert program.endswith("make") and rest.startswith("images BASE_IMAGE=python:3.11-slim")
    expected = [
        f"docker {verb} {src}registry.example.com/team/{name}:{tag}"
        for name in ALL_IMAGES
        for tag in (VERSION, "latest")
        for verb, src in (("tag", f"luftpause/{name}:{VERSION} "), ("push", ""))
    ]
    assert lines[1:] == expected


def test_release_without_a_registry_says_how_and_builds_nothing() -> None:
    done = make("release", "DOCKER=false-docker-never-run")
    assert done.returncode != 0
    assert "usage: make release REGISTRY=" in done.stderr
    assert "false-docker-never-run" not in done.stdout + done.stderr


def test_make_test_installs_the_docker_tools_first() -> None:
    makefile = (ROOT / "Makefile").read_text()
    [prerequisites] = re.findall(r"^test: (.*)$", makefile, flags=re.MULTILINE)
    assert prerequisites.split().index("docker-tools") < prerequisites.split().index("pytest")
