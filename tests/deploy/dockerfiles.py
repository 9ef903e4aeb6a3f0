"""Reading deploy/docker/*.Dockerfile for the tests: instructions, stages, and their arguments.

Pure module apart from reading the files. A Dockerfile here is a list of (INSTRUCTION, arguments)
with continuation lines joined and comments dropped; the final stage is what follows the last
FROM, the image that ships.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests import distributions
from tests.deploy.containers import ALL_IMAGES, DOCKERFILES, ROOT, STACK_IMAGES

# Every image's final stage is the same above this line; each adds only its own below it.
SERVICE_MARK = "# ---- service:"
# Every Dockerfile is the same above this line (the base stage, the start of the venv stage); the
# dependency layers of the distributions the image installs follow it.
DEPENDENCY_MARK = "RUN python3 -m venv /opt/luftpause\n"
# What reads a distribution's third-party dependencies from its pyproject.toml in the build.
REQUIREMENTS = DOCKERFILES / "requirements.py"
Instruction = tuple[str, str]

__all__ = ["ALL_IMAGES", "STACK_IMAGES"]


def path(name: str) -> Path:
    return DOCKERFILES / f"{name}.Dockerfile"


def instructions(name: str) -> list[Instruction]:
    out: list[Instruction] = []
    pending = ""
    for raw in path(name).read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        out.append((keyword.upper(), " ".join(rest.split())))
        pending = ""
    return out


def final_stage(name: str) -> list[Instruction]:
    found = instructions(name)
    last = max(i for i, (keyword, _) in enumerate(found) if keyword == "FROM")
    return found[last:]


def one(stage: list[Instruction], keyword: str) -> str:
    values = [args for key, args in stage if key == keyword]
    assert len(values) == 1, f"expected one {keyword}, found {values}"
    return values[0]


def exec_form(args: str) -> list[str]:
    """The JSON array of an exec-form ENTRYPOINT or CMD."""
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def env(stage: list[Instruction]) -> dict[str, str]:
    """Every `ENV KEY=value ...` of the stage (values without spaces, as these files write)."""
    out: dict[str, str] = {}
    for keyword, args in stage:
        if keyword == "ENV":
            for pair in args.split():
                key, _, value = pair.partition("=")
                out[key] = value
    return out


def healthcheck_command(stage: list[Instruction]) -> list[str]:
    args = one(stage, "HEALTHCHECK")
    _, _, command = args.partition("CMD ")
    return exec_form(command)


def shared_text(name: str, until: str) -> str:
    """The file from `ARG BASE_IMAGE` up to (not including) the first line starting `until`."""
    text = path(name).read_text()
    start = text.index("ARG BASE_IMAGE")
    return text[start : text.index(until, start)]


def stage(name: str, alias: str) -> list[Instruction]:
    """The instructions of the stage `FROM ... AS <alias>`, its FROM included."""
    found = instructions(name)
    start = next(i for i, (key, args) in enumerate(found) if key == "FROM" and args.endswith(alias))
    end = next((i for i in range(start + 1, len(found)) if found[i][0] == "FROM"), len(found))
    return found[start:end]


def dependency_layers(name: str) -> dict[str, tuple[Instruction, Instruction]]:
    """Per distribution whose pyproject.toml the venv stage copies: that COPY and the RUN after
    it (which installs its dependencies), in the order of the file."""
    venv = stage(name, " AS venv")
    layers: dict[str, tuple[Instruction, Instruction]] = {}
    for i, (key, args) in enumerate(venv):
        source = args.split()[0]
        if key == "COPY" and source.endswith("/pyproject.toml"):
            folder = ROOT / source.removesuffix("/pyproject.toml")
            [dist] = [d for d in distributions.distributions().values() if d.folder == folder]
            layers[dist.name] = (venv[i], venv[i + 1])
    return layers


def installed(name: str) -> list[distributions.Distribution]:
    """The distributions the image installs, in the order its venv stage installs them."""
    return [distributions.distributions()[n] for n in dependency_layers(name)]


def wheels(name: str) -> list[str]:
    """The wheel files (globs) the venv stage installs without their dependencies."""
    [install] = [
        args for key, args in stage(name, " AS venv") if key == "RUN" and "--no-deps" in args
    ]
    after = install.split("--no-deps", 1)[1].split("&&", 1)[0]
    return after.split()


def final_text(name: str, until: str) -> str:
    """The final stage's text, from its `FROM base` up to (not including) `until`."""
    text = path(name).read_text()
    start = text.rindex("\nFROM base\n")
    return text[start : text.index(until, start)]


def copied_wheels(name: str) -> list[str]:
    """The wheel files (globs) of dist/ the venv stage copies in."""
    return [
        source
        for key, args in stage(name, " AS venv")
        if key == "COPY"
        for source in args.split()[:-1]
        if source.startswith("dist/")
    ]
