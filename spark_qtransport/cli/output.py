"""What commands print: records as an aligned table for people, or JSON for scripts.

Values come from queues (headers, failure messages): control characters are shown as escapes so
that a message cannot drive the terminal.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

__all__ = ["json_option", "show", "show_json_line"]

F = TypeVar("F", bound=Callable[..., Any])

#: control characters (C0, DEL, C1) as escapes: a header from a queue must not drive the terminal
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in range(0x7F, 0xA0)}


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="print JSON for scripts instead of a table")(f)


def _json(value: Any, indent: int | None) -> str:
    # json escapes C0 controls itself; DEL and C1 only occur in strings: escape them too
    return json.dumps(value, indent=indent, default=str, ensure_ascii=False).translate(_JSON_ESCAPES)


def show(rows: list[dict[str, Any]], as_json: bool) -> None:
    """A list of records as an aligned table (control characters escaped, as ``\\x1b``), or as JSON."""
    if as_json:
        click.echo(_json(rows, indent=2))
        return
    if not rows:
        click.echo("(nothing)")
        return
    cols = list(dict.fromkeys(c for r in rows for c in r))
    cells = [{c: "-" if r.get(c) is None else str(r[c]).translate(_ESCAPES) for c in cols} for r in rows]
    names = {c: str(c).translate(_ESCAPES) for c in cols}
    width = {c: max(len(names[c]), *(len(cell[c]) for cell in cells)) for c in cols}
    click.echo("  ".join(names[c].ljust(width[c]) for c in cols).rstrip())
    for cell in cells:
        click.echo("  ".join(cell[c].ljust(width[c]) for c in cols).rstrip())


def show_json_line(value: Any) -> None:
    """One JSON document on one line (a refresh of ``stats --watch --json``)."""
    click.echo(_json(value, indent=None))
