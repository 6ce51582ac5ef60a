"""The documentation's pages as tests read them: a page, the section under one of its headings,
and the fenced blocks of a text, in the order written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def page(name: str) -> str:
    """The text of docs/<name>, as written (option placeholders and all)."""
    return (DOCS / name).read_text(encoding="utf-8")


def section(name: str, title: str) -> str:
    """The text under the heading `title` (any level) of docs/<name>, up to the next heading of the
    same or a higher level; lines inside code fences are never headings."""
    lines = page(name).splitlines()
    fenced, start, level = False, -1, 0
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = None if fenced else re.match(r"(#+) (.*)$", line)
        if heading is None:
            continue
        if start < 0 and heading[2] == title:
            start, level = i + 1, len(heading[1])
        elif start >= 0 and len(heading[1]) <= level:
            return "\n".join(lines[start:i]) + "\n"
    assert start >= 0, f"docs/{name} has no heading {title!r}"
    return "\n".join(lines[start:]) + "\n"


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block in `text`, in order; language "" for a bare fence."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.S | re.M)


def bodies(text: str, language: str) -> list[str]:
    """The bodies of the fenced blocks in `text` written in `language`, in order."""
    return [body for lang, body in blocks(text) if lang == language]
