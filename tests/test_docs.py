"""The user docs say only what exists: commands, make targets, links, paths, endpoint files.

Pure reading: no network, no processes. Checked in README.md, docs/*.md, deploy/README.md and
testkit/luftpause/testkit/README.md:

- every `luftpause <subcommand> [--flag ...]` command line (in fenced shell blocks and in
  inline code; also an inline `fake-engine --profile gpu` without the `luftpause`) names a
  subcommand of `luftpause.cli.SUBCOMMANDS` and only long or short options that subcommand's
  own parser (`build_parser()`, built, never run) knows;
- every `make <target>` names a target of the Makefile;
- every `python -m bench.<name>` names a module under bench/;
- every relative link resolves to a file or directory, and an anchor to a heading of the target
  (GitHub's slugs: lower case, punctuation dropped, spaces as hyphens, -1, -2 for repeats);
- every inline-code path under a top-level folder of the repository (`bench/...`,
  `tests/...`, ...) exists;
- every YAML or TOML block with an `endpoints` list is a valid endpoint file, and every one with
  a `keys` list a valid keys file.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml

from luftpause.cli import SUBCOMMANDS
from luftpause.common.config import parse_config
from luftpause.common.keys import parse_keys
from tests.markdown import (
    ROOT,
    Block,
    Doc,
    anchors,
    inline_code,
    links_in,
    read,
    shell_lines,
    slug,
)

DOCS = sorted(
    [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        ROOT / "deploy" / "README.md",
        ROOT / "testkit" / "luftpause" / "testkit" / "README.md",
    ]
)
# The paths check reads the user docs proper (deploy/ and the test kit name paths relative to
# themselves).
PATH_DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
# Folders whose paths, written in inline code, must exist (relative to the repository root).
TOP_DIRS = ("bench", "deploy", "docs", "examples", "proto", "services", "src", "testkit", "tests")
SHELL_LANGS = {"", "sh", "bash", "shell", "console", "text"}
SHELL_OPERATORS = {"&&", "||", "|", ";", "&", ">", ">>", "<", "2>", "2>&1"}


# --- commands ------------------------------------------------------------------------------

# `luftpause` in command position: at the start of a command (after `;`, `&&`, `|`, `(`, a quote,
# `exec`, or variable assignments), possibly as a path (`.venv/bin/luftpause`). Elsewhere it is an
# argument: `claude mcp add ... luftpause http://...`, `kubectl -n luftpause ...`.
COMMAND = re.compile(r"(?<![\w.-])(?:[\w./-]*/)?luftpause\s+([A-Za-z<{$][^\s]*)((?:\s+\S+)*)")
COMMAND_START = re.compile(
    r"(?:^|&&|\|\||[;|(`'\"]|\$\()\s*(?:(?:exec|env|sudo|nohup|time)\s+|\w+=\S*\s+)*$"
)
# Bare subcommands in inline code (`fake-engine --profile gpu`): only the unmistakable names.
BARE_COMMAND = re.compile(rf"^({'|'.join(re.escape(n) for n in SUBCOMMANDS if '-' in n)})\s+(-.*)$")


@dataclass(frozen=True, slots=True)
class Command:
    doc: str
    subcommand: str
    words: tuple[str, ...]
    text: str


def split_words(text: str) -> list[str]:
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    out: list[str] = []
    for word in words:
        if word in SHELL_OPERATORS or word.startswith((">", "2>")):
            break
        out.append(word)
    return out


def commands_in(text: str, doc: str) -> Iterator[Command]:
    for m in COMMAND.finditer(text):
        if not COMMAND_START.search(text[: m.start()]):
            continue
        name = m.group(1)
        yield Command(doc, name, tuple(split_words(m.group(2))), m.group(0).strip())


def all_commands() -> list[Command]:
    found: list[Command] = []
    for path in DOCS:
        doc = read(path)
        for block in doc.blocks:
            if block.lang in SHELL_LANGS:
                for line in shell_lines(block):
                    found += commands_in(line, doc.name)
        for span in inline_code(doc.prose):
            found += commands_in(span, doc.name)
            if m := BARE_COMMAND.match(span):
                found.append(Command(doc.name, m.group(1), tuple(split_words(m.group(2))), span))
    return found


def is_placeholder(word: str) -> bool:
    return word.startswith(("<", "{", "$", "...")) or word in ("…",)


@cache
def parser_of(subcommand: str) -> argparse.ArgumentParser:
    """The subcommand's own parser, built without running the process."""
    module = importlib.import_module(SUBCOMMANDS[subcommand][0])
    build = getattr(module, "build_parser", None)
    if build is None:  # a package whose `main` lives in a submodule
        build = importlib.import_module(module.main.__module__).build_parser
    parser: argparse.ArgumentParser = build()
    return parser


def options_of(subcommand: str) -> set[str]:
    return {s for a in parser_of(subcommand)._actions for s in a.option_strings}


def flags(words: tuple[str, ...]) -> Iterator[str]:
    for word in words:
        if word == "--":
            return
        if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", word):
            yield word.split("=", 1)[0]


def test_docs_show_some_luftpause_commands() -> None:
    names = {c.subcommand for c in all_commands()}
    assert {"up", "dataplane", "loadgen"} <= names, names


@pytest.mark.parametrize("subcommand", sorted(SUBCOMMANDS))
def test_every_subcommand_builds_its_parser_without_running(subcommand: str) -> None:
    assert "--help" in options_of(subcommand)


def test_every_luftpause_command_names_a_real_subcommand() -> None:
    wrong = [
        f"{c.doc}: {c.text}"
        for c in all_commands()
        if c.subcommand not in SUBCOMMANDS and not is_placeholder(c.subcommand)
    ]
    assert not wrong, "unknown subcommands:\n" + "\n".join(wrong)


def test_every_luftpause_command_uses_only_options_its_subcommand_knows() -> None:
    wrong: list[str] = []
    for c in all_commands():
        if c.subcommand not in SUBCOMMANDS:
            continue
        known = options_of(c.subcommand)
        wrong += [f"{c.doc}: {c.text}: {f}" for f in flags(c.words) if f not in known]
    assert not wrong, "options the subcommand does not have:\n" + "\n".join(wrong)


# --- make targets and bench modules ------------------------------------------------------------


@cache
def make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = re.findall(r"^([A-Za-z0-9_.-]+(?:\s+[A-Za-z0-9_.-]+)*)\s*::?(?!=)", text, re.M)
    return frozenset(t for group in targets for t in group.split())


def code_texts(doc: Doc) -> Iterator[str]:
    """Shell lines of fenced blocks and inline code spans."""
    for block in doc.blocks:
        if block.lang in SHELL_LANGS:
            yield from shell_lines(block)
    yield from inline_code(doc.prose)


MAKE = re.compile(r"(?:^|[\s;&|(])make\s+((?:[\w.-]+=\S*\s+)*)([A-Za-z][\w.-]*)")


def test_every_make_command_names_a_makefile_target() -> None:
    assert {"up", "test", "bench", "images"} <= make_targets()
    wrong: list[str] = []
    seen = 0
    for path in DOCS:
        doc = read(path)
        for text in code_texts(doc):
            for m in MAKE.finditer(text):
                seen += 1
                if m.group(2) not in make_targets():
                    wrong.append(f"{doc.name}: {m.group(0).strip()}")
    assert seen, "no make commands found"
    assert not wrong, "not Makefile targets:\n" + "\n".join(wrong)


BENCH = re.compile(r"python3?\s+-m\s+(bench\.[\w.]+)")


def test_every_bench_module_named_exists() -> None:
    wrong: list[str] = []
    for path in DOCS:
        doc = read(path)
        for text in code_texts(doc):
            for m in BENCH.finditer(text):
                module = ROOT / Path(*m.group(1).split("."))
                if not module.with_suffix(".py").exists() and not module.is_dir():
                    wrong.append(f"{doc.name}: {m.group(1)}")
    assert not wrong, "no such bench module:\n" + "\n".join(wrong)


# --- links, anchors and paths -------------------------------------------------------------------


def broken_link(doc: Doc, target: str) -> str | None:
    """Why a relative link does not resolve, or None."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
        return None  # absolute URL, mailto:
    path_part, _, anchor = target.partition("#")
    dest = (doc.path.parent / path_part).resolve() if path_part else doc.path
    if not dest.exists():
        return "no such file"
    if ROOT not in dest.parents and dest != ROOT:
        return "outside the repository"
    if anchor and dest.suffix == ".md" and anchor.lower() not in anchors(dest):
        return f"no heading #{anchor} in {dest.relative_to(ROOT)}"
    return None


def test_every_relative_link_resolves_to_a_file_and_heading() -> None:
    wrong: list[str] = []
    count = 0
    for path in DOCS:
        doc = read(path)
        for target in links_in(doc):
            count += 1
            if why := broken_link(doc, target):
                wrong.append(f"{doc.name}: ({target}): {why}")
    assert count, "no links found"
    assert not wrong, "broken links:\n" + "\n".join(wrong)


PATHLIKE = re.compile(rf"^(?:\./)?(?:{'|'.join(TOP_DIRS)})/[\w./-]*$")
# Files of other projects that docs/clients.md cites as its sources (Gemini CLI's, Zed's).
OTHER_PROJECTS = {"docs/tools/mcp-server.md", "docs/ai/mcp.md", "docs/ai/use-api-access.md"}


def test_every_repository_path_in_inline_code_exists() -> None:
    wrong: list[str] = []
    for path in PATH_DOCS:
        doc = read(path)
        for span in inline_code(doc.prose):
            for word in span.split():
                word = word.rstrip(",;:")
                if word in OTHER_PROJECTS:
                    continue
                if PATHLIKE.match(word) and not (ROOT / word).exists():
                    wrong.append(f"{doc.name}: {word}")
    assert not wrong, "paths that do not exist:\n" + "\n".join(wrong)


def test_slugs_follow_githubs_rules() -> None:
    assert slug("Profiles (`--profile`)") == "profiles---profile"
    assert slug("What a client sees when something fails") == (
        "what-a-client-sees-when-something-fails"
    )
    assert slug("Proxy overhead (instant-reply engine, kept-alive connections)") == (
        "proxy-overhead-instant-reply-engine-kept-alive-connections"
    )
    assert slug("The real pool with saved slot contexts (`slot_saves: 16`)") == (
        "the-real-pool-with-saved-slot-contexts-slot_saves-16"
    )


# --- endpoint files -------------------------------------------------------------------------


def endpoint_blocks(key: str = "endpoints") -> Iterator[tuple[str, Block, object]]:
    """The YAML and TOML blocks of the docs whose top level has `key`."""
    for path in DOCS:
        doc = read(path)
        for block in doc.blocks:
            if block.lang in ("yaml", "yml"):
                raw = yaml.safe_load(block.text)
            elif block.lang == "toml":
                raw = tomllib.loads(block.text)
            else:
                continue
            if isinstance(raw, dict) and key in raw:
                yield doc.name, block, raw


def test_every_endpoint_file_shown_is_valid() -> None:
    shown = list(endpoint_blocks())
    assert any(name == "README.md" for name, _, _ in shown), "README shows no endpoint file"
    for name, block, raw in shown:
        try:
            parse_config(raw)
        except ValueError as exc:
            pytest.fail(f"{name}, block at line {block.line}: {exc}")


def test_every_keys_file_shown_is_valid() -> None:
    shown = list(endpoint_blocks("keys"))
    assert any(name == "docs/configuration.md" for name, _, _ in shown), "no keys file shown"
    for name, block, raw in shown:
        try:
            parse_keys(raw)
        except ValueError as exc:
            pytest.fail(f"{name}, block at line {block.line}: {exc}")
