"""mkdocs hook: the option tables, made from the code's registry.

A line `<!-- options: reader -->` or `<!-- options: sink -->` in a page becomes the table of the
source's or the sink's options (`spark_qtransport.options.registry.REGISTRY`: name, type and bounds,
default, meaning, the command line's flag that takes the same value), in the registry's order, so
the documentation cannot drift from the code. tests/test_docs.py imports
`options_table` from this file.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PLACEHOLDER = re.compile(r"^<!-- options: (reader|sink) -->$", re.M)
_CODE = re.compile(r"(`[^`]*`)")


def registry(kind: str) -> list[Any]:
    """The options (`registry.Option`) of the source (`reader`) or the sink (`sink`), in order."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from spark_qtransport.options.registry import READ, WRITE, for_side

    return list(for_side({"reader": READ, "sink": WRITE}[kind]).values())


def cell(text: str) -> str:
    """`text` for a table cell: a `<` outside code spans (`odbc:<connection string>`) written as
    `&lt;`, so that it is not taken for an HTML tag."""
    return "".join(part if part.startswith("`") else part.replace("<", "&lt;") for part in _CODE.split(text))


def options_table(kind: str) -> str:
    """The markdown table of `kind`'s options: `| option | type | default | meaning |`, one row each;
    an option the command line takes too says its flag."""
    rows = ["| option | type | default | meaning |", "|---|---|---|---|"]
    for o in registry(kind):
        also = f" (command line: `{o.cli}`)" if o.cli else ""
        rows.append(f"| `{o.name}` | {cell(o.type_text())} | {cell(o.shown)} | {cell(o.meaning)}{also} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return PLACEHOLDER.sub(lambda m: options_table(m[1]), markdown)

