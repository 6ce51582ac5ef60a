"""What every database dialect provides: address parsing, identifier quoting and SQL statements.

A dialect never executes anything (but `stage_rows`): each method returns a `Statement` (SQL text
with quoted identifiers inlined and every value as a driver parameter) that the dialect-free code
in `spark_qtransport.transport` runs on a DB-API connection (`Connection`, `Cursor`: the part of
DB-API it uses, `dbapi.py`). Only already-quoted identifiers are ever formatted into SQL text.
One abstract class per feature, `Dialect` is all of them.

Dialects are immutable: what depends on the server found (`adapt_to_server`) is a configured copy.
"""

from __future__ import annotations

from .addressing import AddressingSql
from .dbapi import Connection, Cursor
from .delayed import DelayedSql
from .driver import DriverSupport
from .install import InstallSql
from .operations import PEEK_PREVIEW_MAX, OperationsSql, check_preview
from .prepared import PreparedSql
from .receive import ReceiveSql
from .send import SendSql
from .settled import BATCHES_TABLE, FAILED_TABLE, BatchRead, SettledSql
from .values import (
    AFTER_MARK,
    LATEST_TIME,
    MARK,
    NUMBER_BASE,
    NUMBERS_PER_MICROSECOND,
    STAGED_COLUMNS,
    TABLE_PRIVILEGES,
    ClaimFailures,
    ClaimNumbering,
    ClaimResult,
    PickedRows,
    QueueAddress,
    Statement,
    check_privileges,
    one_line,
)

__all__ = [
    "QueueAddress", "Statement", "Dialect", "ClaimFailures", "ClaimNumbering", "PickedRows", "NUMBERS_PER_MICROSECOND", "NUMBER_BASE", "MARK", "AFTER_MARK", "ClaimResult", "LATEST_TIME", "STAGED_COLUMNS", "TABLE_PRIVILEGES", "check_privileges",
    "one_line", "AddressingSql", "InstallSql", "PreparedSql", "ReceiveSql", "SendSql", "DelayedSql", "OperationsSql",
    "DriverSupport", "Connection", "Cursor", "PEEK_PREVIEW_MAX", "check_preview", "SettledSql", "BatchRead", "BATCHES_TABLE", "FAILED_TABLE",
]


class Dialect(InstallSql, ReceiveSql, PreparedSql, SendSql, SettledSql, OperationsSql, DelayedSql, DriverSupport):
    """The SQL of one database. Subclasses: `PostgresDialect`, `SqlServerDialect` (frozen dataclasses)."""
