"""The distributions of the tree, as their pyproject.toml files declare them (pure reading).

One distribution per folder (`services/*/`, `proto/`, `testkit/`) and the workspace at the root
(its code in `src/`), each shipping its part of the namespace package `luftpause`
(docs/architecture.md, "Where the code is"). Used by tests/test_layout.py (what each may import)
and tests/deploy/ (what each image installs).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The folders of the distributions besides the workspace (ROOT), in the order the Makefile
# lists them and the images install them.
FOLDERS = ("services/common", "proto", "services/scheduler", "services/dataplane",
           "services/runtime", "testkit")  # fmt: skip
WORKSPACE = "luftpause"


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The canonical name a requirement string (`psycopg[binary]>=3.2`) asks for."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    assert match, requirement
    return canonical(match.group(0))


@dataclass(frozen=True, slots=True)
class Distribution:
    """One distribution of the tree: its folder, the root its part of `luftpause` lives under,
    and what its pyproject.toml declares."""

    name: str
    folder: Path
    source: Path
    version: str
    requires: tuple[str, ...]
    extras: tuple[str, ...]
    scripts: tuple[tuple[str, str], ...]

    @property
    def requires_names(self) -> set[str]:
        return {requirement_name(r) for r in self.requires}

    @property
    def siblings(self) -> set[str]:
        """The distributions of the tree it depends on."""
        return self.requires_names & set(distributions())

    @property
    def wheel(self) -> str:
        """The start of its wheel's file name (`luftpause_common-`)."""
        return self.name.replace("-", "_") + "-"


def read(folder: Path) -> Distribution:
    data = tomllib.loads((folder / "pyproject.toml").read_text())
    project = data["project"]
    [package] = data["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert Path(package).name == "luftpause", f"{folder}: ships {package}, not luftpause"
    return Distribution(
        name=canonical(project["name"]),
        folder=folder,
        source=folder / Path(package).parent,
        version=project["version"],
        requires=tuple(project.get("dependencies", ())),
        extras=tuple(r for rs in project.get("optional-dependencies", {}).values() for r in rs),
        scripts=tuple(sorted(project.get("scripts", {}).items())),
    )


@cache
def distributions() -> dict[str, Distribution]:
    """Every distribution of the tree, in FOLDERS order and the workspace last, by name."""
    found = [read(ROOT / folder) for folder in FOLDERS] + [read(ROOT)]
    return {d.name: d for d in found}


def closure(name: str) -> list[Distribution]:
    """The distribution `name` and every one of the tree it needs, in FOLDERS order."""
    needed = {name}
    todo = [name]
    while todo:
        for sibling in distributions()[todo.pop()].siblings - needed:
            needed.add(sibling)
            todo.append(sibling)
    return [d for d in distributions().values() if d.name in needed]


def with_script(script: str) -> Distribution:
    """The distribution whose console scripts include `script`."""
    [found] = [d for d in distributions().values() if script in dict(d.scripts)]
    return found
