"""What commands print: records as an aligned table for people, or JSON for scripts, and every
other line (errors, warnings, DDL) through `echo`.

Values come from queues (headers, failure messages) and from the command line (queue names in
errors): control characters are shown as escapes (``\\x1b``) so that neither a message nor a name
can drive the terminal. `escape` is the one rule; `echo` is the one way out, for stdout and stderr.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from ..transport.session import OUTAGE_LOGGER

__all__ = ["json_option", "show", "show_json_line", "escape", "echo", "echo_script", "escaped_usage_error", "escaped_logging"]

F = TypeVar("F", bound=Callable[..., Any])

#: what a terminal may act on or a reader may be misled by: C0 and C1 controls, DEL, the line and
#: paragraph separators and the bidirectional overrides ("Trojan source")
_CONTROLS = (*range(0x20), *range(0x7F, 0xA0), 0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F),
             *range(0x2066, 0x206A))
_ESCAPES = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in _CONTROLS}
#: the same, keeping line breaks: for text of several lines (DDL, a JSON document)
_LINE_ESCAPES = {c: e for c, e in _ESCAPES.items() if c != 0x0A}
#: json escapes C0 controls itself; the others only occur in strings: escape them too
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in _CONTROLS if c >= 0x7F}


def escape(text: object) -> str:
    """One value or one line as it may be printed: every control character as an escape, line
    breaks included (``\\x1b``, ``\\x0a``)."""
    return str(text).translate(_ESCAPES)


def echo(text: object = "", *, err: bool = False) -> None:
    """Print `text` (on stderr with `err`), its control characters escaped but its line breaks
    kept. Every line the command prints goes through here."""
    click.echo(str(text).translate(_LINE_ESCAPES), err=err)


def echo_script(text: str) -> None:
    """SQL for a DBA to run, printed as it is: escaping would change a name it creates, so a
    script naming a table with a control character is refused (wrong usage) rather than printed."""
    if text.translate(_LINE_ESCAPES) != text:
        raise click.UsageError("a name given holds a control character, which this script cannot show as it is; "
                               "create the table with sqlqueue create-queue / create-outbox instead")
    echo(text)


def escaped_usage_error(exc: click.ClickException) -> None:
    """Click's own error (a usage error, a bad value), its message escaped: click quotes what was
    typed (``Got unexpected extra argument (...)``) and strips only CSI sequences, and only when
    piped (naming something else than was typed, and passing OSC sequences on)."""
    exc.message = escape(exc.message)  # type: ignore[misc] # the text click prints after "Error: "


class _EscapingHandler(logging.Handler):
    """Log records (a routing refusal names a queue from a message header) as one escaped line on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            echo(f"{record.levelname.lower()}: {escape(record.getMessage())}", err=True)
        except Exception:  # noqa: BLE001 - logging must not end the command
            self.handleError(record)


@contextmanager
def escaped_logging() -> Iterator[None]:
    """While a command runs, the package's warnings print escaped on stderr (as Python's last-resort
    handler would print them raw) unless the application configured logging itself."""
    logger = logging.getLogger("spark_qtransport")
    if logger.hasHandlers():
        yield
        return
    # warnings, and both lines of a database outage (its end is INFO: a command waiting through
    # one says when it goes on)
    handler = _EscapingHandler(logging.INFO)
    handler.addFilter(lambda r: r.levelno >= logging.WARNING or r.name == OUTAGE_LOGGER)
    outage = logging.getLogger(OUTAGE_LOGGER)
    level = outage.level
    if outage.getEffectiveLevel() > logging.INFO:
        outage.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        outage.setLevel(level)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="print JSON for scripts instead of a table")(f)


def _json(value: Any, indent: int | None) -> str:
    return json.dumps(value, indent=indent, default=str, ensure_ascii=False).translate(_JSON_ESCAPES)


def show(rows: list[dict[str, Any]], as_json: bool) -> None:
    """A list of records as an aligned table (control characters escaped, as ``\\x1b``), or as JSON."""
    if as_json:
        echo(_json(rows, indent=2))
        return
    if not rows:
        echo("(nothing)")
        return
    cols = list(dict.fromkeys(c for r in rows for c in r))
    cells = [{c: "-" if r.get(c) is None else escape(r[c]) for c in cols} for r in rows]
    names = {c: escape(c) for c in cols}
    width = {c: max(display_width(names[c]), *(display_width(cell[c]) for cell in cells)) for c in cols}
    echo("  ".join(_pad(names[c], width[c]) for c in cols).rstrip())
    for cell in cells:
        echo("  ".join(_pad(cell[c], width[c]) for c in cols).rstrip())


def display_width(text: str) -> int:
    """The columns `text` takes in a terminal: a wide character (CJK, fullwidth forms) two, a
    combining mark none, the rest one; so a table with queue names in Chinese stays aligned."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, width: int) -> str:
    return text + " " * (width - display_width(text))


def show_json_line(value: Any) -> None:
    """One JSON document on one line (a refresh of ``stats --watch --json``)."""
    echo(_json(value, indent=None))
