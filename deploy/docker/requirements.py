"""The third-party requirements of luftpause distributions, read from their pyproject.toml.

    python3 requirements.py PYPROJECT... > requirements.txt

deploy/docker/*.Dockerfile install each distribution's dependencies in a layer of their own
with it, before the wheels: the workspace's own distributions (`luftpause`, `luftpause-*`) are
left out, as their wheels come from dist/. Standard library only: it runs on the base image's
python3, before any venv exists.
"""

from __future__ import annotations

import re
import sys
import tomllib

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def is_workspace(requirement: str) -> bool:
    """Whether a requirement names one of the workspace's own distributions."""
    match = NAME.match(requirement.strip())
    name = re.sub(r"[-_.]+", "-", match.group(0)).lower() if match else ""
    return name == "luftpause" or name.startswith("luftpause-")


def third_party(pyproject: str) -> list[str]:
    """The `[project] dependencies` of one pyproject.toml, the workspace's own left out."""
    with open(pyproject, "rb") as file:
        requirements: list[str] = tomllib.load(file)["project"]["dependencies"]
    return [r for r in requirements if not is_workspace(r)]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for pyproject in argv:
        print("\n".join(third_party(pyproject)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
