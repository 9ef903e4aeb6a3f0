"""The test targets agree with each other: the Makefile, pyproject.toml's markers, `.ci/run`, the
README and docs/development.md.

Pure reading: no processes. Checked:

- every marker pyproject.toml declares is deselected by its `addopts` and selected by exactly one
  `test-*` target of the Makefile (`pytest ... -m <marker>`), so no marked test is left out of
  every target and none runs twice;
- `make test` reaches pytest only without `-m`, that is with the `addopts` selection, and its
  calls together run the whole suite once (what one leaves out with `--ignore`, another runs);
- `make test-all` runs every other test target, and `.ci/run` runs `make test` and then
  `make test-real`;
- the README and docs/development.md each have a table row for every test target and for
  nothing else, each with the time it took.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass
from functools import cache

import pytest

from tests.markdown import ROOT

TABLE_DOCS = ("README.md", "docs/development.md")
# A row of a markdown table whose first cell is `make <test target>`, and the time in its last.
ROW = re.compile(r"^\|\s*`make (test[\w-]*)`\s*\|.*\|\s*([^|]*?)\s*\|\s*$", re.M)
DURATION = re.compile(r"\d+(?:\.\d+)?\s*(?:min|minutes|s)\b")


@dataclass(frozen=True, slots=True)
class Rule:
    prerequisites: tuple[str, ...]
    recipe: tuple[str, ...]


def parse_rules(text: str) -> dict[str, Rule]:
    """Explicit rules of a Makefile (continuation lines joined): target -> prerequisites, recipe.
    Variable assignments (`:=`, `?=`, `=`) are not rules."""
    joined = re.sub(r"\\\n", " ", text)
    rules: dict[str, Rule] = {}
    current: list[str] = []
    for line in joined.splitlines():
        if line.startswith("\t"):
            for target in current:
                rule = rules[target]
                rules[target] = Rule(rule.prerequisites, (*rule.recipe, line.strip()))
            continue
        m = re.match(r"^([A-Za-z0-9_.$()/-]+(?:\s+[A-Za-z0-9_.$()/-]+)*)\s*:(?![=:])(.*)$", line)
        if m is None or line.startswith(("#", ".PHONY")):
            current = [] if line.strip() and not line.startswith("#") else current
            continue
        current = m.group(1).split()
        for target in current:
            rules[target] = Rule(tuple(m.group(2).split()), ())
    return rules


@cache
def makefile() -> dict[str, Rule]:
    return parse_rules((ROOT / "Makefile").read_text(encoding="utf-8"))


def make_test_targets() -> set[str]:
    return {t for t in makefile() if t == "test" or t.startswith("test-")}


def pytest_markers(recipe_line: str) -> list[str] | None:
    """The `-m` expression of a recipe line that runs pytest ([] without one); None if it does
    not run pytest."""
    if not re.search(r"(?:^|[\s/])pytest(?:\s|$)", recipe_line):
        return None
    words = shlex.split(recipe_line)
    runs = [i for i, w in enumerate(words) if w.endswith("/pytest") or w == "pytest"]
    if not runs:
        return None
    args = words[runs[0] + 1 :]
    return [args[i + 1] for i, w in enumerate(args[:-1]) if w == "-m"]


def reachable(target: str) -> set[str]:
    seen: set[str] = set()
    todo = [target]
    while todo:
        name = todo.pop()
        if name in seen or name not in makefile():
            continue
        seen.add(name)
        todo += makefile()[name].prerequisites
    return seen


@cache
def pytest_config() -> dict[str, object]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    config: dict[str, object] = pyproject["tool"]["pytest"]["ini_options"]
    return config


def declared_markers() -> set[str]:
    markers = pytest_config()["markers"]
    assert isinstance(markers, list)
    return {str(m).split(":", 1)[0].strip() for m in markers}


def test_the_parser_reads_rules_continuations_and_recipes_but_not_assignments() -> None:
    text = (
        "A := 1\nB ?= x:y\n.PHONY: a b\n# c: not a rule\n"
        "a: b \\\n\tc\n\t$(BIN)/pytest -q \\\n\t  -m slow\nb c:\n\techo hi\n"
    )
    rules = parse_rules(text)
    assert set(rules) == {"a", "b", "c"}
    assert rules["a"].prerequisites == ("b", "c")
    assert [line.split() for line in rules["a"].recipe] == [["$(BIN)/pytest", "-q", "-m", "slow"]]
    assert rules["b"].recipe == rules["c"].recipe == ("echo hi",)
    assert pytest_markers(rules["a"].recipe[0]) == ["slow"]
    assert pytest_markers("$(BIN)/pytest -q") == []
    assert pytest_markers("echo pytest-ish") is None


def test_every_marker_is_left_out_by_default_and_run_by_exactly_one_test_target() -> None:
    addopts = shlex.split(str(pytest_config()["addopts"]))
    default = addopts[addopts.index("-m") + 1]
    deselected = set(re.findall(r"not (\w+)", default))
    assert re.fullmatch(r"not \w+( and not \w+)*", default), default
    assert declared_markers() == deselected == {"slow", "real_engine"}
    runs: dict[str, list[str]] = {marker: [] for marker in declared_markers()}
    for target in make_test_targets():
        for line in makefile()[target].recipe:
            for expression in pytest_markers(line) or []:
                runs.setdefault(expression, []).append(target)
    assert all(len(targets) == 1 for targets in runs.values()), runs
    assert set(runs) == declared_markers(), runs


def pytest_paths(recipe_line: str) -> tuple[set[str], set[str]]:
    """The folders or files a pytest recipe line names, and those it leaves out (`--ignore`)."""
    words = shlex.split(recipe_line)
    start = next(i for i, w in enumerate(words) if w.endswith("/pytest") or w == "pytest")
    named = {w for w in words[start + 1 :] if not w.startswith("-") and (ROOT / w).exists()}
    ignored = {w.split("=", 1)[1] for w in words if w.startswith("--ignore=")}
    return named, ignored


def test_make_test_runs_pytest_with_the_default_selection_only() -> None:
    lines = [
        line
        for target in reachable("test")
        for line in makefile()[target].recipe
        if pytest_markers(line) is not None
    ]
    assert [pytest_markers(line) for line in lines] == [[]] * len(lines), lines
    # One call runs the whole suite but what it leaves out, and the others run exactly that.
    (whole,) = [p for p in map(pytest_paths, lines) if not p[0]]
    rest = [named for named, _ in map(pytest_paths, lines) if named]
    assert sorted(whole[1]) == sorted(path for named in rest for path in named), lines
    assert {"lint", "typecheck", "pytest"} <= set(makefile()["test"].prerequisites)


def test_test_all_and_ci_run_every_test_target() -> None:
    others = make_test_targets() - {"test-all"}
    assert set(makefile()["test-all"].prerequisites) == others
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    m = re.search(r"^TARGETS=\(([^)]*)\)", ci, re.M)
    assert m, "no TARGETS=(...) in .ci/run"
    assert m.group(1).split() == ["test", "test-real", "test-slow"]
    assert 'make "$target"' in ci


@pytest.mark.parametrize("doc", TABLE_DOCS)
def test_the_docs_table_has_a_timed_row_for_each_test_target(doc: str) -> None:
    rows = dict(ROW.findall((ROOT / doc).read_text(encoding="utf-8")))
    assert set(rows) == make_test_targets(), f"{doc}: rows {sorted(rows)}"
    untimed = {target: cell for target, cell in rows.items() if not DURATION.search(cell)}
    assert not untimed, f"{doc}: no time in the last cell: {untimed}"
