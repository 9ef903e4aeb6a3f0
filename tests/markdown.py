"""Reading markdown for the docs tests: fenced blocks and prose, inline code, shell lines,
headings' anchors as GitHub makes them, and links. No network, no processes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Block:
    """A fenced code block: its language and its text."""

    lang: str
    text: str
    line: int


@dataclass(frozen=True, slots=True)
class Doc:
    path: Path
    blocks: tuple[Block, ...]
    prose: str  # the text outside fenced blocks

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT))


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)[^\n]*$")


@cache
def read(path: Path) -> Doc:
    blocks: list[Block] = []
    prose: list[str] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3).lower(), i + 1
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        blocks.append(Block(lang, "\n".join(body), start))
        prose.append("")  # keep paragraphs apart
    return Doc(path, tuple(blocks), "\n".join(prose))


def inline_code(text: str) -> Iterator[str]:
    """The inline code spans of markdown prose (single or double backticks)."""
    for m in re.finditer(r"(`+)(.+?)\1", text, flags=re.DOTALL):
        yield " ".join(m.group(2).split())


def shell_lines(block: Block) -> Iterator[str]:
    """A shell block's command lines: continuations joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    for line in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line)
        if line.strip():
            yield line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in read(path).prose.splitlines():
        m = re.match(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)


def without_inline_code(text: str) -> str:
    return re.sub(r"(`+).+?\1", "", text, flags=re.DOTALL)


def links_in(doc: Doc) -> Iterator[str]:
    prose = without_inline_code(doc.prose)
    yield from (m.group(1) for m in LINK.finditer(prose))
    yield from (m.group(1) for m in REF_LINK.finditer(prose))
