"""mkdocs hook: the option tables, made from the code's registry.

A line `<!-- options: reader -->` or `<!-- options: sink -->` in a page becomes the table of the
source's (`spark_qtransport.spark.options.OPTIONS`) or the sink's (`WRITER_OPTIONS`) options, in
the registry's order, so the documentation cannot drift from the code. tests/test_docs.py imports
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


def registry(kind: str) -> dict[str, tuple[str, str]]:
    """The options of the source (`reader`) or the sink (`sink`): name -> (default shown, meaning)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from spark_qtransport.spark.options import OPTIONS, WRITER_OPTIONS

    return {"reader": OPTIONS, "sink": WRITER_OPTIONS}[kind]


def cell(text: str) -> str:
    """`text` for a table cell: a `<` outside code spans (`odbc:<connection string>`) written as
    `&lt;`, so that it is not taken for an HTML tag."""
    return "".join(part if part.startswith("`") else part.replace("<", "&lt;") for part in _CODE.split(text))


def options_table(kind: str) -> str:
    """The markdown table of `kind`'s options: `| option | default | meaning |`, one row each."""
    rows = ["| option | default | meaning |", "|---|---|---|"]
    rows += [f"| `{name}` | {cell(default)} | {cell(meaning)} |" for name, (default, meaning) in registry(kind).items()]
    return "\n".join(rows)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return PLACEHOLDER.sub(lambda m: options_table(m[1]), markdown)

