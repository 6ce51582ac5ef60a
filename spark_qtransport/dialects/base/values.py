"""The values dialects hand out and take: addresses, statements, claim results, staged columns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError

__all__ = ["QueueAddress", "Statement", "ClaimResult", "STAGED_COLUMNS", "TABLE_PRIVILEGES", "check_privileges",
           "one_line"]


#: columns of a staged row, in the order executors write them (see `Dialect.stage_rows`)
STAGED_COLUMNS = (
    "sink", "batch_id", "attempt", "kind", "route", "message_id", "headers", "body", "ttbr_ms", "delay_ms", "due",
)


#: the table privileges the connector ever needs (and `Dialect.grants` / `Dialect.privileges` take)
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")


def check_privileges(privileges: Sequence[str]) -> tuple[str, ...]:
    """Privilege names, upper-cased, each one of `TABLE_PRIVILEGES` (they are written into SQL)."""
    out = tuple(str(p).upper() for p in privileges)
    bad = [p for p in out if p not in TABLE_PRIVILEGES]
    if bad or not out:
        raise ConfigError(f"table privileges must be some of {', '.join(TABLE_PRIVILEGES)}, not {list(privileges)!r}")
    return out


@dataclass(frozen=True)
class QueueAddress:
    """A parsed, unquoted queue address. ``schema``/``catalog`` are None for the connection's default."""

    table: str
    schema: str | None = None
    catalog: str | None = None

    def with_table(self, table: str) -> QueueAddress:
        return QueueAddress(table, self.schema, self.catalog)

    def __str__(self) -> str:
        parts = [p for p in (self.catalog, self.schema, self.table) if p is not None]
        return ".".join(parts)


@dataclass(frozen=True)
class Statement:
    """One SQL statement: text plus bound parameters (a dict for psycopg, a tuple for pyodbc).

    `counted`: the rows the statement wrote are the first value of its one result row, not the
    driver's rowcount (a batch of several bounded writes, whose rowcount would be the first's)."""

    sql: str
    params: Any = field(default=None)
    counted: bool = False


@dataclass(frozen=True)
class ClaimResult:
    """What one claim transaction did."""

    deleted: int  # rows removed from the queue
    expired: int  # of which expired, dropped and counted
    poison: int  # of which moved raw to the error queue
    claimed: int  # of which inserted into the claim table
    max_claim: int | None  # highest claim sequence inserted, None if none
    max_source: int | None  # highest queue sequence seen, None if none
    min_claim: int | None = None  # lowest claim sequence inserted, None if none
    forward: int = 0  # claimed rows whose headers may name a ForwardDestination (text match)


def one_line(text: str) -> str:
    """The first non-blank line of an error's text, whitespace collapsed, passwords masked: a
    driver's later lines may quote the statement or the row at fault."""
    from ...connections import mask

    for line in text.splitlines():
        if line.strip():
            return mask(" ".join(line.split()))
    return ""
