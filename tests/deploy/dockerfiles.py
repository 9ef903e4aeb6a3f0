"""Reading deploy/docker/*.Dockerfile for the tests: instructions, stages, and their arguments.

Pure module apart from reading the files. A Dockerfile here is a list of (INSTRUCTION, arguments)
with continuation lines joined and comments dropped; the final stage is what follows the last
FROM, the image that ships.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.deploy.containers import ALL_IMAGES, DOCKERFILES, STACK_IMAGES

# The service images share every instruction above this line; each adds only its own below it.
SERVICE_MARK = "# ---- service:"
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
