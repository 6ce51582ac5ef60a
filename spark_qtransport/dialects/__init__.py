"""Database dialects: all SQL text and identifier quoting lives here, one package per database and
one module per feature in each (`base` says what every dialect provides)."""

from __future__ import annotations

from typing import Any

from ..errors import field_error
from .base import (
    BATCHES_TABLE,
    NUMBER_BASE,
    BatchRead,
    ClaimFailures,
    ClaimNumbering,
    ClaimResult,
    Connection,
    Cursor,
    Dialect,
    PickedRows,
    QueueAddress,
    Statement,
)

__all__ = ["BATCHES_TABLE", "BatchRead", "NUMBER_BASE", "ClaimFailures", "ClaimNumbering", "ClaimResult", "Connection", "Cursor", "Dialect", "PickedRows", "QueueAddress", "Statement", "dialect_for", "dialect_named"]


def dialect_named(name: str) -> Dialect:
    if name == "postgres":
        from .postgres import PostgresDialect

        return PostgresDialect()
    if name == "sqlserver":
        from .sqlserver import SqlServerDialect

        return SqlServerDialect()
    raise field_error("url", f"unknown dialect {name!r}")


def dialect_for(url: Any) -> Dialect:
    """The dialect a `ConnectionURL` selects."""
    return dialect_named(url.dialect)
